#!/usr/bin/env python
"""Calibrate one capability template on a base model (issue 30: structured data on the demo base agent).

Runs the real `synthesize` stage (checks, then calibration with hints and bisection between adjacent levels)
for `--capability` on `--model` (default: the committed demo base agent), from a diagnosis that selects just
that capability (written here: what a diagnosis chooses is not what this measures). Prints every attempt and
writes JSON: the admitted level (and mix), the hint share, the reward-based constant-group share, success with
and without hints, and the rollouts calibration ran. Exit 1 when calibration fails (the attempts are written).

    OMP_NUM_THREADS=1 python benchmarks/calibrate_base.py --capability structured_data_reasoning \\
        --train-steps 12 --out benchmarks/results/calibrate_structured_demo.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, write_result


def write_diagnosis(store, capability: str) -> str:
    """A diagnosis artifact that selects `capability` alone (the shape `synthesize` reads)."""
    from trace_cli.config.schemas import validate

    entry = {"name": capability, "description": capability.replace("_", " "), "mean_delta": 0.0}
    entry |= {"std_delta": 0.0, "mean_coverage": 0.0, "std_coverage": 0.0, "runs_passed": 1, "runs_total": 1}
    doc = {"kind": "diagnosis", "version": 1, "rollouts": "store://rollouts/none", "analyst": "rules"}
    doc |= {"thresholds": {"coverage_min": 0.1, "delta_min": 0.2, "runs": 1, "min_runs": 1}}
    doc |= {"episodes": {"failed": 0, "passed": 0}, "rejected": []}
    doc["selected"] = [{**entry, "example_failed_task_ids": []}]
    validate(doc, "diagnosis.v1.json")
    with store.writer("diagnosis", "diagnose", {"benchmark": capability}, [], name="selects") as w:
        (w.path / "capabilities.yaml").write_text(yaml.safe_dump(doc))
    return "store://diagnosis/selects"


def train_and_eval(st, base: str, env: str, a) -> dict:
    """A GRPO adapter (the demo recipe's settings; its first steps are calibration's episodes), then success of
    the base and the adapter on the environment's held-out seeds."""
    from trace_cli.stages.base import execute

    reuse = a.seeds * a.rollouts // 64
    cfg = {"method": "grpo", "env": env, "model": base, "max_steps": a.train_steps, "num_generations": 8}
    cfg |= {"per_device_batch_size": 64, "gradient_accumulation_steps": 1, "learning_rate": 0.002}
    cfg |= {"temperature": 1.0, "max_completion_length": 1024, "max_new_tokens": 120, "max_turns": 12}
    cfg |= {"checkpoint_every": 0, "reuse_calibration": min(reuse, a.train_steps)}
    if a.validation:
        cfg["validation"] = {"seeds": a.validation, "every": 4, "patience": 2}
    t0 = time.monotonic()
    adapter = execute("train", cfg, st).main
    out = {
        "train": {k: cfg.get(k) for k in ("max_steps", "learning_rate", "reuse_calibration", "validation")}
    }
    out["validation"] = adapter.summary.get("validation")
    out["train_s"] = round(time.monotonic() - t0, 1)
    for who, model in (("base", base), ("adapter", adapter.uri)):
        ev = {"model": model, "env": env, "seeds": a.eval_seeds, "max_new_tokens": 120, "max_turns": 12}
        summary = execute("eval", ev, st).outputs["eval"].summary
        out[who] = {"pass@1": summary["pass@1"], "mean_reward": summary.get("mean_reward")}
    out["gain"] = round(out["adapter"]["pass@1"] - out["base"]["pass@1"], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capability", default="structured_data_reasoning")
    ap.add_argument("--model", default=str(REPO / "examples" / "demo-base-agent"))
    ap.add_argument("--seeds", type=int, default=48, help="calibration seeds (groups) per attempt, at most")
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--hint-share", type=float, default=0.25)
    ap.add_argument("--level", type=int, default=None, help="the starting level (default: the template's)")
    ap.add_argument("--max-attempts", type=int, default=8)
    ap.add_argument("--store", default=None, help="a store directory (default: a temporary one)")
    ap.add_argument("--train-steps", type=int, default=0, help="then train a GRPO adapter this many steps")
    ap.add_argument("--eval-seeds", default="1000000:1000100", help="held-out seeds of the environment")
    ap.add_argument("--out", default=None)
    ap.add_argument("--target", default="shop", help="the target whose tools the environment keeps")
    ap.add_argument("--tools", default="needed", choices=("needed", "target"))
    ap.add_argument(
        "--diagnosis",
        default=None,
        help="a diagnosis in --store (store://diagnosis/NAME) of the base's target conversations: its LACKING "
        "conversations shape the environment (default: one written here that selects the capability alone)",
    )
    ap.add_argument(
        "--validation",
        default=None,
        help="seeds A:B of the environment for the adapter's early stopping (every 4 steps, patience 2)",
    )
    a = ap.parse_args(argv)
    from trace_cli.errors import CheckFailed
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    st = Store(Path(a.store or tempfile.mkdtemp(prefix="calibrate-")) / "store")
    base = execute("model", {"source": a.model}, st).main
    cal = {
        "seeds": a.seeds,
        "rollouts": a.rollouts,
        "hint_share": a.hint_share,
        "max_attempts": a.max_attempts,
        "max_new_tokens": 120,  # as training samples: the admitted attempt's episodes become its first steps
    }
    diagnosis = a.diagnosis or write_diagnosis(st, a.capability)
    cfg = {"diagnosis": diagnosis, "capability": a.capability, "model": base.uri}
    cfg |= {"target": a.target, "tools": a.tools, "calibration": cal, "max_turns": 12}
    if a.level is not None:
        cfg["params"] = {"level": a.level}
    t0, out = time.monotonic(), {"command": " ".join(sys.argv), "config": cfg}
    try:
        env = execute("synthesize", cfg, st).main
        doc = yaml.safe_load((Path(env.path) / "environment.yaml").read_text())
        attempts, out["passed"] = doc["calibration"]["attempts"], True
        out["shaped_by"] = doc.get("shaped_by")
    except CheckFailed as e:
        attempts, out["passed"] = e.details["attempts"], False
    last = attempts[-1]
    out |= {"attempts": attempts, "rollouts_run": sum(x["seeds"] * x["rollouts"] for x in attempts)}
    out |= {k: last[k] for k in ("params", "hint_share", "frac_constant_low", "frac_constant_reward")}
    out |= {k: last[k] for k in ("mean_success", "mean_success_unhinted", "mean_reward")}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    for x in attempts:
        print(
            f"attempt {x['attempt']}: {x['params']} hints {x['hint_share']:.2f} success {x['mean_success']:.3f} "
            f"(unhinted {x['mean_success_unhinted']:.3f}) reward {x['mean_reward']:.3f} constant-low "
            f"{x['frac_constant_low']:.2f} all-1 {x['frac_all1']:.2f} {'IN BAND' if x['in_band'] else x['next']}"
        )
    if out["passed"] and a.train_steps:
        out["held_out"] = train_and_eval(st, base.uri, env.uri, a)
    print(json.dumps({k: v for k, v in out.items() if k not in ("attempts", "config")}))
    if a.out:
        write_result(a.out, out)
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
