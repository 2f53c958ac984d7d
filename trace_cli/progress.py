"""Progress of long work on stderr, in one of two forms:

* a rich bar when stderr is a terminal;
* otherwise (CI, nohup, SLURM, a pipe) plain lines, at most one every TRACE_PROGRESS_INTERVAL seconds
  (default 30) plus one at the end, e.g. `eval shop: 64/200 (32%), 12 s elapsed, ~25 s left`, so a log
  file shows that work is moving without filling up with bar redraws.
TRACE_NO_PROGRESS=1 turns both off (tests that compare stderr use it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
DEFAULT_INTERVAL = 30.0


def enabled() -> bool:
    """Rich bars: only on a terminal."""
    return sys.stderr.isatty() and not os.environ.get("TRACE_NO_PROGRESS")


def lines_enabled() -> bool:
    """Plain progress lines: when stderr is not a terminal."""
    return not sys.stderr.isatty() and not os.environ.get("TRACE_NO_PROGRESS")


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("TRACE_PROGRESS_INTERVAL", DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


class _Lines:
    """Counts work and prints a line when the interval has passed (and once at the end if anything was)."""

    def __init__(self, total: int | None, description: str):
        self.total, self.description = total, description
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.interval = _interval()
        self.printed = False

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._print(now)

    def finish(self) -> None:
        if self.printed:  # a closing line only when the work was long enough to report on at all
            self._print(time.monotonic(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        el = now - self.t0
        if self.total:
            pct = 100.0 * self.done / self.total
            left = el / self.done * (self.total - self.done) if self.done and not final else 0.0
            msg = f"{self.description}: {self.done}/{self.total} ({pct:.0f}%), {el:.0f} s elapsed"
            msg += ", done" if final else f", ~{left:.0f} s left"
        else:
            msg = f"{self.description}: {self.done} done, {el:.0f} s elapsed"
        print(msg, file=sys.stderr, flush=True)
        self.printed = True


def track(items: Iterable[T], *, total: int | None = None, description: str = "working") -> Iterator[T]:
    if lines_enabled():
        lines = _Lines(total, description)
        for x in items:
            yield x
            lines.advance()
        lines.finish()
        return
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
        self._lines: _Lines | None = None

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
        elif lines_enabled():
            self._lines = _Lines(self.total, self.description)
        return self

    def advance(self, n: int = 1) -> None:
        if self._p is not None:
            self._p.advance(self._task, n)
        elif self._lines is not None:
            self._lines.advance(n)

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)
        elif self._lines is not None and exc[0] is None:
            self._lines.finish()
