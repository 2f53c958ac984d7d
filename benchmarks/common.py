"""What the benchmarks share: the check that the `trace_cli` measured is the checkout's, the command and machine
a result came from, writing the JSON result, a plain text table, and timing stage runs through
`trace_cli.stages.base.execute`.

A benchmark runs as a script (`python benchmarks/NAME.py`), so Python puts benchmarks/ first on sys.path and the
script imports this module as `common`. `trace_cli` is imported as the installed package (`make install`
installs the checkout in editable mode); importing this module refuses to go on when that package is another
copy than this checkout's, so a result always measures the code beside it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _checkout_package() -> None:
    """Exit (2) unless `import trace_cli` finds this checkout's package."""
    import importlib.util

    spec = importlib.util.find_spec("trace_cli")
    where = Path(spec.origin).resolve().parent if spec and spec.origin else None
    if where != REPO / "trace_cli":
        sys.stderr.write(
            f"error: the benchmarks measure this checkout's trace_cli ({REPO / 'trace_cli'}), but `import "
            f"trace_cli` finds {where or 'nothing'}: run `make install` and use {REPO / '.venv/bin/python'}\n"
        )
        raise SystemExit(2)


_checkout_package()


def command() -> str:
    """How the benchmark was started, as its result records it."""
    return " ".join(["python", *sys.argv])


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def machine(*packages: str, **extra: Any) -> dict[str, Any]:
    """The machine a result was measured on: CPUs (count, the ones this process may use, model), memory,
    load, platform and Python, the `__version__` of each of `packages` (imported here), then `extra`."""
    import importlib

    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory_gib = None
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model(),
        "memory_gib": memory_gib,
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    for name in packages:
        info[name] = getattr(importlib.import_module(name), "__version__", None)
    return {**info, **extra}


def _git(*args: str) -> str | None:
    """git's output in the checkout (stripped), None where git or the repository is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


def git_dirty() -> bool | None:
    """Whether tracked files had uncommitted changes (None without git)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


@functools.cache
def at_start() -> dict[str, Any]:
    """The commit and dirty flag of the checkout when this process first asked (importing this module asks):
    what a benchmark measured, even if the tree changes while it runs."""
    return {"commit": git_commit(), "dirty": git_dirty()}


def write_result(path: str | Path, doc: dict[str, Any]) -> Path:
    """The result as indented JSON (values JSON cannot hold as their str), its directory made if need be; every
    result names the commit it was measured at and whether the tree was dirty — as they were when the process
    started (kept where the doc has them); a tree that changed since is said (`tree_changed_during_run`: the
    commit and dirty flag at writing)."""
    start = at_start()
    now = {"commit": git_commit(), "dirty": git_dirty()}
    doc = {**start, **doc}
    if now != start and "tree_changed_during_run" not in doc:
        doc["tree_changed_during_run"] = now
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain text table on stdout: the first column left-aligned, the others right-aligned, each as wide as its
    widest cell; None prints as '-'."""
    cells = [[str(c) for c in columns]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for r in cells:
        cols = zip(r, widths, strict=True)
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cols)))


class Stages:
    """Runs stages in one store (`execute`: skip-if-up-to-date makes a rerun cheap), logging each to stderr and
    keeping its wall time, rounded to 0.1 s, by label in `timings`. A stage's wall time is also kept in the store
    (logs/stage_times.jsonl, by artifact): a rerun that finds the stage up to date reports the time it took when it
    ran, and names the label in `reused`, so a benchmark resumed across sessions still says what each stage cost."""

    def __init__(self, store_dir: str | Path):
        from trace_cli.store import Store

        self.store = Store(store_dir)
        self.times_path = Path(store_dir) / "logs" / "stage_times.jsonl"
        self.timings: dict[str, float] = {}
        self.reused: list[str] = []

    def run(self, label: str, stage: str, config: dict[str, Any], *, name: str | None = None):
        """`execute(stage, config)` in the store: the stage's Outcome."""
        from trace_cli.stages.base import execute

        log(f"{label}: {stage} {json.dumps(config, default=str)[:400]}")
        t = time.monotonic()
        out = execute(stage, config, self.store, name=name)
        wall = self.settle(label, out.main.uri, round(time.monotonic() - t, 1), skipped=out.skipped)
        done = "up to date" if out.skipped else json.dumps(out.main.summary, default=str)[:400]
        log(f"{label}: {wall} s  {done}")
        return out

    def settle(self, label: str, uri: str, wall: float, *, skipped: bool) -> float:
        """Record `label`'s wall time (a stage run here or in a child process): a fresh artifact's in the store's
        log, an up-to-date one's from that log when it has it. Returns the time recorded."""
        earlier = self.earlier_times().get(uri) if skipped else None
        if earlier is not None:
            wall = earlier
            self.reused.append(label)
        elif not skipped:
            self.times_path.parent.mkdir(parents=True, exist_ok=True)
            with self.times_path.open("a") as f:
                f.write(json.dumps({"artifact": uri, "wall_s": wall}) + "\n")
        self.timings[label] = wall
        return wall

    def earlier_times(self) -> dict[str, float]:
        """Wall time of each artifact this store's stages made, by URI (the last run's)."""
        if not self.times_path.exists():
            return {}
        rows = (json.loads(line) for line in self.times_path.read_text().splitlines() if line.strip())
        return {r["artifact"]: r["wall_s"] for r in rows}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


at_start()  # the checkout as this process found it (a benchmark imports this module first)
