#!/usr/bin/env python
"""Sample efficiency (issue 16, the paper's headline): TRACE vs GRPO-on-target vs base at equal rollout budgets.

From one base agent (default: the demo's, examples/demo-base-agent), at every budget B (rollouts, all counted):
- base:        the base agent, untrained;
- grpo_target: one GRPO LoRA adapter trained on the target environment (shop) with B rollouts;
- TRACE:       diagnose the base agent's own target rollouts (D rollouts, counted), synthesize and calibrate one
               environment per selected capability with the base agent (calibration rollouts counted), train one
               GRPO adapter per environment with what is left of B, and compose them: `moe` (ours, the headline
               `trace` column), `router` (the paper's) and `merge` (the consolidation ablation). The MoE gates'
               training transcripts are rollouts too and are counted.
Every method is measured on the same held-out target seeds (never used by any training, diagnosis or calibration
step), with several training seeds per method; the table reports mean ± std over training seeds.

Ablations in the same run: the single best adapter against the compositions, and the held-out tasks that exactly
one expert solves (alone, as a plain adapter) that the base does not: how many of them each composition keeps.

Prints a table, writes JSON (`budgets` rows: rollouts, base, grpo_target, trace, router, moe, merge, single_best,
each {mean, std, runs}) and a PNG plot of pass@1 against rollouts.

    python benchmarks/sample_efficiency.py --quick        # 1 training seed, 2 budgets, 100 held-out seeds
    OMP_NUM_THREADS=1 nohup python benchmarks/sample_efficiency.py > se.log 2>&1 &   # full: 4 budgets x 3 seeds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, Stages, command, print_table, write_result

TARGET_TRAIN = 300000  # target seeds for diagnosis and GRPO-on-target (disjoint from the held-out range)
METHODS = ("base", "grpo_target", "trace", "router", "moe", "merge", "single_best")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 training seed, budgets 192,384, 100 held-out seeds, calibration 8x4 (3 attempts)",
    )
    ap.add_argument("--store", type=Path, default=None, help="store directory (default: a fresh temp dir)")
    ap.add_argument("--base", default=str(REPO / "examples" / "demo-base-agent"), help="base model source")
    ap.add_argument("--target", default="shop")
    ap.add_argument("--budgets", default="256,512,1024,2048", help="rollout budgets, comma-separated")
    ap.add_argument("--train-seeds", default="0,1,2", help="training seeds per method")
    ap.add_argument("--held-out", default="500000:500200", help="held-out target seeds A:B (>= 200)")
    ap.add_argument("--diagnosis-rollouts", type=int, default=200, help="TRACE's target rollouts to diagnose")
    ap.add_argument("--calibration", default="16x8", help="calibration seeds x rollouts per attempt")
    ap.add_argument("--calibration-attempts", type=int, default=5, help="calibration attempts at most")
    ap.add_argument("--moe-seeds", type=int, default=16, help="MoE gate transcripts per environment")
    ap.add_argument("--episodes-per-step", type=int, default=32, help="GRPO episodes per optimizer step")
    ap.add_argument("--num-generations", type=int, default=8, help="GRPO group size")
    ap.add_argument("--learning-rate", type=float, default=2e-3, help="GRPO learning rate (LoRA)")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--out", type=Path, default=RESULTS / "sample_efficiency.json")
    ap.add_argument("--plot", type=Path, default=None, help="PNG path (default: next to --out)")
    a = ap.parse_args(argv)
    if a.quick:
        a.budgets, a.train_seeds, a.held_out = "192,384", "0", "500000:500100"
        a.diagnosis_rollouts, a.calibration, a.moe_seeds = 96, "8x4", 8
        a.calibration_attempts = 3
    a.budgets = sorted(int(x) for x in a.budgets.split(","))
    a.train_seeds = [int(x) for x in a.train_seeds.split(",")]
    a.cal_seeds, a.cal_rollouts = (int(x) for x in a.calibration.split("x"))
    a.plot = a.plot or a.out.with_suffix(".png")
    return a


class Bench(Stages):
    """Stages in one store, timed (common.Stages), and the held-out evaluation every method gets."""

    def __init__(self, store_dir: Path, max_new_tokens: int):
        super().__init__(store_dir)
        self.max_new_tokens = max_new_tokens

    def eval(self, label: str, model: str, env: str, seeds: str, **kw) -> dict[str, Any]:
        cfg = {"model": model, "env": env, "seeds": seeds, "max_new_tokens": self.max_new_tokens, **kw}
        out = self.run(label, "eval", cfg)
        ev, ro = out.outputs["eval"], out.outputs["rollouts"]
        return {"pass@1": ev.summary["pass@1"], "episodes": ev.summary["episodes"], "solved": solved(ro.path)}


def solved(rollouts_dir: Path) -> dict[str, bool]:
    import duckdb

    rows = duckdb.sql(
        f"SELECT task_id, bool_and(success) FROM '{rollouts_dir / 'episodes.parquet'}' GROUP BY 1"
    )
    return {t: bool(s) for t, s in rows.fetchall()}


def grpo_cfg(a, env: str, model: str, rollouts: int, seed: int) -> dict[str, Any]:
    return {
        "method": "grpo",
        "env": env,
        "model": model,
        "seed": seed,
        "max_steps": max(1, rollouts // a.episodes_per_step),
        "num_generations": a.num_generations,
        "per_device_batch_size": a.episodes_per_step,
        "gradient_accumulation_steps": 1,
        "learning_rate": a.learning_rate,
        "max_new_tokens": a.max_new_tokens,
        "max_completion_length": 1024,
        "checkpoint_every": 0,
        "require_learning": False,  # a budget too small to learn is a result, not an error
    }


def calibration_rollouts(env_art) -> int:
    import duckdb

    p = env_art.path / "calibration.parquet"
    return int(duckdb.sql(f"SELECT coalesce(sum(seeds * rollouts), 0) FROM '{p}'").fetchall()[0][0])


def run_trace(b: Bench, a, base: str, budget: int, seed: int, held: str, base_solved) -> dict[str, Any]:
    """One TRACE run at `budget`: returns pass@1 per variant, rollouts spent, and the one-expert ablation."""
    from trace_cli.errors import TraceError

    spent = {"diagnosis": a.diagnosis_rollouts, "calibration": 0, "grpo": 0, "moe": 0}
    diag_seeds = f"{TARGET_TRAIN}:{TARGET_TRAIN + a.diagnosis_rollouts}"
    ro = b.run(
        "trace/diagnosis-rollouts",
        "eval",
        {"model": base, "env": a.target, "seeds": diag_seeds, "max_new_tokens": a.max_new_tokens},
    ).outputs["rollouts"]
    diag = b.run("trace/diagnose", "diagnose", {"rollouts": ro.uri, "analyst": "rules", "seed": seed})
    d_art = diag.outputs["diagnosis"]
    selected = list(d_art.summary.get("selected", []))
    envs: dict[str, str] = {}
    for cap in selected:
        try:
            out = b.run(
                f"trace/synthesize/{cap}",
                "synthesize",
                {
                    "diagnosis": d_art.uri,
                    "capability": cap,
                    "target": a.target,
                    "model": base,
                    "seed": seed,
                    "calibration": {
                        "seeds": a.cal_seeds,
                        "rollouts": a.cal_rollouts,
                        "max_attempts": a.calibration_attempts,
                        "max_new_tokens": a.max_new_tokens,
                    },
                },
            )
        except TraceError as e:  # calibration out of band after every attempt: count the worst case
            print(f"  {cap}: no environment ({e})", file=sys.stderr)
            spent["calibration"] += a.calibration_attempts * a.cal_seeds * a.cal_rollouts
            continue
        env_art = out.outputs["environment"]
        spent["calibration"] += calibration_rollouts(env_art)
        envs[cap] = env_art.uri
    result: dict[str, Any] = {"selected": selected, "environments": sorted(envs)}
    if not envs:
        result["spent"] = spent
        return result
    moe_rollouts = a.moe_seeds * (len(envs) + 1) if len(envs) > 1 else 0
    left = budget - sum(spent.values()) - moe_rollouts
    per = left // len(envs)
    if per < a.episodes_per_step:
        result["over_budget"] = f"{left} rollouts left for {len(envs)} adapters"
        per = a.episodes_per_step
    adapters: dict[str, str] = {}
    # require_learning is off (a budget too small to learn is a result): say how much of each run had no signal
    constant: dict[str, Any] = result.setdefault("constant_groups", {})
    for cap, env in envs.items():
        cfg = grpo_cfg(a, env, base, per, seed)
        art = b.run(f"trace/train/{cap}", "train", cfg).outputs["adapter"]
        spent["grpo"] += cfg["max_steps"] * a.episodes_per_step
        adapters[cap] = art.uri
        constant[cap] = art.summary.get("frac_constant_groups")
    experts = {cap: b.eval(f"trace/eval/{cap}", uri, a.target, held) for cap, uri in adapters.items()}
    result["experts"] = {cap: e["pass@1"] for cap, e in experts.items()}
    best = max(experts, key=lambda c: experts[c]["pass@1"])
    result["single_best"] = {"capability": best, "pass@1": experts[best]["pass@1"]}
    comps: dict[str, dict[str, Any]] = {}
    if len(adapters) == 1:  # nothing to compose: every composition is the single adapter
        comps = {m: experts[best] for m in ("router", "moe", "merge")}
    else:
        uris = [adapters[c] for c in sorted(adapters)]
        moe_seeds = f"{TARGET_TRAIN + 50000}:{TARGET_TRAIN + 50000 + a.moe_seeds}"
        for method, extra in (
            ("router", {}),
            ("moe", {"moe": {"target": a.target, "seeds": moe_seeds}}),
            ("merge", {}),
        ):
            cfg = {"method": method, "base": base, "adapters": uris, "seed": seed, **extra}
            comp = b.run(f"trace/compose/{method}", "compose", cfg).outputs["composition"]
            comps[method] = b.eval(f"trace/eval/{method}", comp.uri, a.target, held)
        spent["moe"] = moe_rollouts
    for m, e in comps.items():
        result[m] = e["pass@1"]
    result["trace"] = result["moe"]
    result["ablation"] = one_expert_ablation(base_solved, experts, comps)
    result["spent"] = spent
    return result


def one_expert_ablation(base_solved, experts, comps) -> dict[str, Any]:
    """Held-out tasks the base fails and exactly one expert solves; how many each composition keeps."""
    tasks = set(base_solved)
    only = {
        t
        for t in tasks
        if not base_solved.get(t) and sum(bool(e["solved"].get(t)) for e in experts.values()) == 1
    }
    return {
        "one_expert_tasks": len(only),
        "kept": {m: sum(bool(c["solved"].get(t)) for t in only) for m, c in comps.items()},
    }


def mean_std(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "std": None, "runs": 0}
    return {
        "mean": round(statistics.fmean(xs), 4),
        "std": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0,
        "runs": len(xs),
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import tempfile

    store_dir = a.store or Path(tempfile.mkdtemp(prefix="sample-eff-"))
    b = Bench(store_dir, a.max_new_tokens)
    t0 = time.monotonic()
    base = b.run("base/import", "model", {"source": a.base}).outputs["model"].uri
    base_ev = b.eval("base/eval", base, a.target, a.held_out)
    runs: list[dict[str, Any]] = []
    for budget in a.budgets:
        for seed in a.train_seeds:
            row: dict[str, Any] = {"budget": budget, "seed": seed, "base": base_ev["pass@1"]}
            cfg = grpo_cfg(a, a.target, base, budget, seed)
            cfg["seeds"] = f"{TARGET_TRAIN}:{TARGET_TRAIN + 100000}"
            g = b.run(f"grpo_target/{budget}/{seed}", "train", cfg).outputs["adapter"]
            row["grpo_target"] = b.eval(f"grpo_target/eval/{budget}/{seed}", g.uri, a.target, a.held_out)[
                "pass@1"
            ]
            row["grpo_rollouts"] = cfg["max_steps"] * a.episodes_per_step
            row["grpo_constant_groups"] = g.summary.get("frac_constant_groups")
            row.update(run_trace(b, a, base, budget, seed, a.held_out, base_ev["solved"]))
            runs.append(row)
            print(json.dumps(row, default=str), file=sys.stderr, flush=True)
    rows = []
    for budget in a.budgets:
        rs = [r for r in runs if r["budget"] == budget]
        row = {"rollouts": budget}
        for m in METHODS:
            vals = [r.get(m)["pass@1"] if isinstance(r.get(m), dict) else r.get(m) for r in rs]
            row[m] = mean_std(vals)
        rows.append(row)
    res = {
        "benchmark": "sample_efficiency",
        "command": command(),
        "quick": a.quick,
        "held_out": a.held_out,
        "train_seeds": a.train_seeds,
        "settings": {
            "episodes_per_step": a.episodes_per_step,
            "num_generations": a.num_generations,
            "learning_rate": a.learning_rate,
            "diagnosis_rollouts": a.diagnosis_rollouts,
            "calibration": a.calibration,
            "calibration_attempts": a.calibration_attempts,
            "moe_seeds": a.moe_seeds,
        },
        "budgets": rows,
        "gain_ratio": {str(r["rollouts"]): gain_ratio(r) for r in rows},
        "runs": runs,
        "timings_s": b.timings,
        "wall_s": round(time.monotonic() - t0, 1),
        "store": str(store_dir),
    }
    write_result(a.out, res)
    plot(rows, a.plot)
    print_budgets(rows)
    print(f"\nJSON: {a.out}   plot: {a.plot}   wall {res['wall_s']} s")
    return 0


def gain_ratio(row: dict[str, Any]) -> float | None:
    """TRACE's gain over base divided by GRPO-on-target's (the paper: 2.9x); None when GRPO gained nothing."""
    b, g, t = (row[m]["mean"] for m in ("base", "grpo_target", "trace"))
    return round((t - b) / (g - b), 3) if None not in (b, g, t) and g - b > 1e-9 else None


def print_budgets(rows: list[dict[str, Any]]) -> None:
    """pass@1 mean±std of every method at every budget, and the gain ratio."""

    def cell(v: dict[str, Any]) -> str | None:
        return None if v["mean"] is None else f"{v['mean']:.3f}±{v['std']:.3f}"

    table = []
    for r in rows:
        ratio = None if gain_ratio(r) is None else f"{gain_ratio(r):.2f}x"
        table.append([r["rollouts"], *(cell(r[m]) for m in METHODS), ratio])
    print_table(["rollouts", *METHODS, "gain ratio"], table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    xs = [r["rollouts"] for r in rows]
    for m, style in (
        ("base", "k--"),
        ("grpo_target", "o-"),
        ("router", "s-"),
        ("moe", "D-"),
        ("merge", "x:"),
    ):
        ys = [r[m]["mean"] for r in rows]
        es = [r[m]["std"] or 0.0 for r in rows]
        if all(y is not None for y in ys):
            ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=3, label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollouts (all counted)")
    ax.set_ylabel("pass@1 on held-out target seeds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
