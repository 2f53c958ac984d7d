"""Progress bars on stderr (rich), shown only when stderr is a terminal and TRACE_NO_PROGRESS is unset."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("TRACE_NO_PROGRESS")


def track(items: Iterable[T], *, total: int | None = None, description: str = "working") -> Iterator[T]:
    if not enabled():
        yield from items
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as p:
        task = p.add_task(description, total=total)
        for x in items:
            yield x
            p.advance(task)


class Bar:
    """Manual progress (for loops that advance by more than one), e.g. batched rollouts."""

    def __init__(self, total: int, description: str = "working"):
        self.total = total
        self.description = description
        self._p = None
        self._task = None

    def __enter__(self) -> Bar:
        if enabled():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._p.__enter__()
            self._task = self._p.add_task(self.description, total=self.total)
        return self

    def advance(self, n: int = 1) -> None:
        if self._p is not None:
            self._p.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)
