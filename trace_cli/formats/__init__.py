"""The formats rollouts enter and leave the store in: τ²-bench results JSON and OpenAI-format JSONL.

Readers (`tau2_read`, `jsonl.parse`; `trace ingest`) turn a file into episode rows and bad records (JSON
handling in `codec`, the schema check in `schema_check`); writers (`tau2`, `jsonl.lines`; `trace export`) are
their inverses: pure functions from stored episodes (as `trace_cli.store.rollouts.read_episodes` returns them)
to documents. This module holds the export's output checks and one atomic file writer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from trace_cli.errors import UsageError


def check_out(out: str | Path, *, force: bool = False) -> Path:
    """The output path, checked before any work: its folder exists and it is not overwritten by accident."""
    p = Path(out)
    if p.is_dir():
        raise UsageError(f"{p}: is a directory; --out takes a file path")
    if p.exists() and not force:
        raise UsageError(f"{p}: already exists", hint="pass --force to overwrite it, or choose another --out")
    if not p.parent.is_dir():
        raise UsageError(f"{p.parent}: no such directory for --out")
    return p


def write_atomic(path: Path, write: Callable[[IO[str]], None]) -> None:
    """Write through a temp file in the same folder, then rename: a reader (or a Ctrl-C) never sees half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
