#!/usr/bin/env python
"""Sandbox bounds under attack (issue 35): what a hostile module's answers and files cost the CLI.

1. A 60 MB answer (a task_metadata() of 60 MB) and a 64 MB answer without a newline (raw bytes on the
   protocol pipe): wall time until the worker refuses it, the parent's CPU and the parent's peak RSS
   (each case in a fresh process, so the peak is that case's).
2. 400,000 empty files in one call: how many the work tmpfs takes before ENOSPC, and how long that takes.
3. The per-call cost of the protocol (ping: thaw, request, answer, thread check, freeze; median of 200) and
   the start of a worker.

Goal: the answers refused in < 2 s at < 200 MB parent RSS; files bounded by the tmpfs's inode count.

    python benchmarks/sandbox_bench.py
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

from common import RESULTS, machine, print_table, write_result

BIG = """
def make_env(**params):
    from trace_cli.envs.synthetic import TEMPLATES
    env = TEMPLATES['precondition_verification'](**params)
    env.task_metadata = lambda: {'answer_values': ['x' * (60 << 20)]}
    return env
"""
RAW = """
import os
def make_env(**params):
    for fd in range(3, 12):
        try:
            os.write(fd, b'x' * (64 << 20))
        except OSError:
            pass
"""
FILES = """
def make_env(**params):
    n = 0
    try:
        for n in range(400000):
            open(f'f{n}', 'w').close()
    except OSError as e:
        raise RuntimeError(f'{n} files, then errno {e.errno}')
    raise RuntimeError(f'{n + 1} files, no error')
"""


def _case(name: str) -> dict:
    """One case, run in this (fresh) process."""
    from trace_cli.envs.sandbox import Limits, SandboxError, SandboxViolation, SandboxWorker

    src = {"60 MB answer": BIG, "64 MB without a newline": RAW, "400,000 files": FILES}[name]
    with SandboxWorker(src, Limits(memory_mb=2048, timeout_s=120, cpu_s=60)) as w:
        handle = w.call("new", params={})["handle"] if name.startswith("60") else None
        t0, c0 = time.monotonic(), time.process_time()
        try:
            w.call("task_metadata", handle=handle) if handle else w.call("new", params={})
            outcome = "accepted"
        except (SandboxViolation, SandboxError) as e:
            outcome = e.reason
        return {
            "case": name,
            "wall_s": round(time.monotonic() - t0, 3),
            "parent_cpu_s": round(time.process_time() - c0, 3),
            "parent_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "outcome": outcome[:120],
        }


def _calls() -> dict:
    from trace_cli.envs.sandbox import SandboxWorker

    t0 = time.monotonic()
    with SandboxWorker("def make_env(**params):\n    pass\n") as w:
        start = time.monotonic() - t0
        times = []
        for _ in range(200):
            t = time.perf_counter()
            w.call("ping")
            times.append(time.perf_counter() - t)
    return {"worker_start_s": round(start, 3), "ping_median_ms": round(statistics.median(times) * 1e3, 2)}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        print(json.dumps(_case(sys.argv[2]) if sys.argv[2] != "calls" else _calls()))
        return
    rows = []
    for name in ("60 MB answer", "64 MB without a newline", "400,000 files", "calls"):
        r = subprocess.run(
            [sys.executable, __file__, "--case", name], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cases, calls = rows[:3], rows[3]
    print_table(
        ["case", "wall s", "parent CPU s", "parent peak RSS MB", "outcome"],
        [[c["case"], c["wall_s"], c["parent_cpu_s"], c["parent_peak_rss_mb"], c["outcome"]] for c in cases],
    )
    print(f"worker start {calls['worker_start_s']} s; ping median {calls['ping_median_ms']} ms")
    doc = {"machine": machine(), "cases": cases, **calls}
    print(write_result(RESULTS / "sandbox_bench.json", doc))


if __name__ == "__main__":
    main()
