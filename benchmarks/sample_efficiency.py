#!/usr/bin/env python
"""Sample efficiency (issue 16, the paper's headline): TRACE vs GRPO-on-target vs base at equal rollout budgets.

From one base agent (default: the demo's, examples/demo-base-agent), at every budget B (rollouts, all counted):
- base:        the base agent, untrained;
- grpo_target: a GRPO LoRA adapter trained on the target environment (shop) with B rollouts;
- TRACE:       diagnose the base agent's own target rollouts (D rollouts, counted), synthesize and calibrate one
               environment per selected capability (calibration rollouts counted; the base agent calibrates, except
               where --calibrator names another policy, as the demo recipe does for multi_step_completion), train one
               GRPO adapter per environment with what is left of B, and compose them: `moe` (ours, the headline
               `trace` column), `router` (the paper's) and `merge` (the consolidation ablation, largest budget).
               The MoE gates' training transcripts are rollouts too and are counted.
One GRPO run per method and training seed gives every budget: it stores the adapter after the step each smaller
budget affords (`snapshot_steps`; lr_scheduler constant, so a snapshot after k steps is what a k-step run trains).
Every method is measured on the same held-out target seeds (never used by any training, diagnosis or calibration
step), with several training seeds per method; the table reports mean +- std over training seeds.

Ablations in the same run (largest budget): the single best adapter against the compositions, and the held-out
tasks that exactly one expert solves (alone, as a plain adapter) that the base does not: how many of them each
composition keeps; per task family, pass@1 of base, GRPO-on-target and the compositions (where the gain comes from).

Prints a table, writes JSON (`budgets` rows: rollouts, base, grpo_target, trace, router, moe, merge, single_best,
each {mean, std, runs}) and a PNG plot of pass@1 against rollouts.

    python benchmarks/sample_efficiency.py --quick        # 1 training seed, 2 budgets, 100 held-out seeds
    OMP_NUM_THREADS=1 nohup python benchmarks/sample_efficiency.py > se.log 2>&1 &   # full: 4 budgets x 3 seeds
    # the full run split over processes (one per core), then combined:
    for s in 0 1 2; do OMP_NUM_THREADS=1 nohup python benchmarks/sample_efficiency.py --train-seeds $s \\
        --out results/se-$s.json > se-$s.log 2>&1 & done; wait
    python benchmarks/sample_efficiency.py --combine results/se-0.json results/se-1.json results/se-2.json
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
TWIN = "policy:demonstration?rate=0.5"  # the base agent's scripted twin (the demo recipe's multi-step calibrator)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[-1:]),
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 training seed, budgets 512,768, 100 held-out seeds, diagnosis 100, calibration 8x4",
    )
    ap.add_argument("--store", type=Path, default=None, help="store directory (default: a fresh temp dir)")
    ap.add_argument("--base", default=str(REPO / "examples" / "demo-base-agent"), help="base model source")
    ap.add_argument("--target", default="shop")
    ap.add_argument("--budgets", default="512,640,768,1024", help="rollout budgets, comma-separated")
    ap.add_argument("--train-seeds", default="0,1,2", help="training seeds per method")
    ap.add_argument("--held-out", default="500000:500200", help="held-out target seeds A:B (>= 200)")
    ap.add_argument("--diagnosis-rollouts", type=int, default=100, help="TRACE's target rollouts to diagnose")
    ap.add_argument("--calibration", default="16x4", help="calibration seeds x rollouts per attempt")
    ap.add_argument("--calibration-attempts", type=int, default=3, help="calibration attempts at most")
    ap.add_argument(
        "--calibrator",
        action="append",
        default=None,
        metavar="CAPABILITY=MODEL",
        help=f"calibrate this capability's environment with MODEL instead of the base agent (default: "
        f"multi_step_completion={TWIN}, as the demo recipe; 'none' for the base agent everywhere)",
    )
    ap.add_argument(
        "--methods",
        default="grpo_target,trace",
        help="trained methods to run (comma-separated subset of grpo_target,trace); the base is always measured",
    )
    ap.add_argument("--moe-seeds", type=int, default=16, help="MoE gate transcripts per environment")
    ap.add_argument("--episodes-per-step", type=int, default=32, help="GRPO episodes per optimizer step")
    ap.add_argument("--num-generations", type=int, default=8, help="GRPO group size")
    ap.add_argument("--learning-rate", type=float, default=2e-3, help="GRPO learning rate (LoRA)")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON path (default: results/sample_efficiency[_quick].json)"
    )
    ap.add_argument("--plot", type=Path, default=None, help="PNG path (default: next to --out)")
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        default=None,
        metavar="JSON",
        help="no training: merge the runs of these result files (one per training seed) into one table",
    )
    a = ap.parse_args(argv)
    if a.quick:
        a.budgets, a.train_seeds, a.held_out = "512,768", "0", "500000:500100"
        a.calibration, a.moe_seeds = "8x4", 8
    a.budgets = sorted(int(x) for x in a.budgets.split(","))
    a.train_seeds = [int(x) for x in a.train_seeds.split(",")]
    a.methods = [m for m in a.methods.split(",") if m]
    if not a.methods or set(a.methods) - {"grpo_target", "trace"}:
        ap.error(f"--methods: a comma-separated subset of grpo_target,trace, not {','.join(a.methods)!r}")
    a.cal_seeds, a.cal_rollouts = (int(x) for x in a.calibration.split("x"))
    cal = a.calibrator if a.calibrator is not None else [f"multi_step_completion={TWIN}"]
    a.calibrators = dict(c.split("=", 1) for c in cal if c != "none")
    a.out = a.out or RESULTS / ("sample_efficiency_quick.json" if a.quick else "sample_efficiency.json")
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
        return {
            "pass@1": ev.summary["pass@1"],
            "episodes": ev.summary["episodes"],
            "solved": solved(ro.path),
            "families": families(ro.path),
        }


def solved(rollouts_dir: Path) -> dict[str, bool]:
    import duckdb

    rows = duckdb.sql(
        f"SELECT task_id, bool_and(success) FROM '{rollouts_dir / 'episodes.parquet'}' GROUP BY 1"
    )
    return {t: bool(s) for t, s in rows.fetchall()}


def families(rollouts_dir: Path) -> dict[str, float]:
    """pass@1 per task family (the shop's task ids are FAMILY-SEED)."""
    import duckdb

    rows = duckdb.sql(
        f"SELECT regexp_replace(task_id, '-[0-9]+$', '') AS family, avg(success::DOUBLE) "
        f"FROM '{rollouts_dir / 'episodes.parquet'}' GROUP BY 1 ORDER BY 1"
    )
    return {f: round(v, 4) for f, v in rows.fetchall()}


def grpo_cfg(a, env: str, model: str, steps: int, seed: int) -> dict[str, Any]:
    cfg = {
        "method": "grpo",
        "env": env,
        "model": model,
        "seed": seed,
        "max_steps": steps,
        "num_generations": a.num_generations,
        "per_device_batch_size": a.episodes_per_step,
        "gradient_accumulation_steps": 1,
        "learning_rate": a.learning_rate,
        "lr_scheduler": "constant",  # snapshots are the shorter runs
        "max_new_tokens": a.max_new_tokens,
        "max_completion_length": 1024,
        "checkpoint_every": 0,
        "require_learning": False,  # a budget too small to learn is a result, not an error
    }
    return cfg


def train_curve(b: Bench, label: str, cfg: dict[str, Any], steps: list[int]) -> dict[int, Any]:
    """One GRPO run to max(steps) storing the adapter after every other entry: {steps: adapter artifact}."""
    top = max(steps)
    snaps = sorted({k for k in steps if k < top})
    art = b.run(label, "train", {**cfg, "max_steps": top, "snapshot_steps": snaps}).outputs["adapter"]
    out = {top: art}
    for k, uri in (art.summary.get("snapshots") or {}).items():
        out[int(k)] = b.store.resolve(uri, kind="adapter")
    return out


def calibration_rollouts(env_art) -> int:
    import duckdb

    p = env_art.path / "calibration.parquet"
    return int(duckdb.sql(f"SELECT coalesce(sum(seeds * rollouts), 0) FROM '{p}'").fetchall()[0][0])


def run_grpo_target(b: Bench, a, base: str, seed: int) -> dict[int, dict[str, Any]]:
    """GRPO on the target: one run per training seed, the adapter after budget // episodes_per_step steps."""
    steps = {B: max(1, B // a.episodes_per_step) for B in a.budgets}
    cfg = grpo_cfg(a, a.target, base, max(steps.values()), seed)
    cfg["seeds"] = f"{TARGET_TRAIN}:{TARGET_TRAIN + 100000}"
    arts = train_curve(b, f"grpo_target/{seed}", cfg, list(steps.values()))
    out = {}
    for B, k in steps.items():
        ev = b.eval(f"grpo_target/eval/{B}/{seed}", arts[k].uri, a.target, a.held_out)
        out[B] = {
            "grpo_target": ev["pass@1"],
            "grpo_rollouts": k * a.episodes_per_step,
            "grpo_constant_groups": arts[k].summary.get("frac_constant_groups"),
            "families_grpo_target": ev["families"],
        }
    return out


def run_trace(b: Bench, a, base: str, seed: int, base_ev: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """TRACE at every budget from one diagnosis, one calibration and one GRPO run per environment."""
    from trace_cli.errors import TraceError

    fixed = {"diagnosis": a.diagnosis_rollouts, "calibration": 0, "moe": 0}
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
    calibrated_by: dict[str, str] = {}
    for cap in selected:
        calibrator = a.calibrators.get(cap, base)
        try:
            out = b.run(
                f"trace/synthesize/{cap}/{seed}",
                "synthesize",
                {
                    "diagnosis": d_art.uri,
                    "capability": cap,
                    "target": a.target,
                    "tools": "needed",
                    "model": calibrator,
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
            fixed["calibration"] += a.calibration_attempts * a.cal_seeds * a.cal_rollouts
            continue
        env_art = out.outputs["environment"]
        fixed["calibration"] += calibration_rollouts(env_art)
        envs[cap] = env_art.uri
        calibrated_by[cap] = "base" if calibrator == base else calibrator
    common: dict[str, Any] = {
        "selected": selected,
        "environments": sorted(envs),
        "calibrated_by": calibrated_by,
    }
    if not envs:
        return {B: {**common, "spent": dict(fixed)} for B in a.budgets}
    fixed["moe"] = a.moe_seeds * (len(envs) + 1) if len(envs) > 1 else 0
    steps: dict[int, int] = {}
    over: dict[int, str] = {}
    for B in a.budgets:
        per = (B - sum(fixed.values())) // len(envs)
        steps[B] = per // a.episodes_per_step
        if steps[B] < 1:
            over[B] = f"{B - sum(fixed.values())} rollouts left for {len(envs)} adapters; trained 1 step each"
            steps[B] = 1
    curves: dict[str, dict[int, Any]] = {}
    for cap, env in envs.items():
        curves[cap] = train_curve(
            b, f"trace/train/{cap}/{seed}", grpo_cfg(a, env, base, 1, seed), list(steps.values())
        )
    top = max(a.budgets)
    moe_seeds = f"{TARGET_TRAIN + 50000}:{TARGET_TRAIN + 50000 + a.moe_seeds}"
    results: dict[int, dict[str, Any]] = {}
    for B in a.budgets:
        k = steps[B]
        adapters = {cap: curves[cap][k] for cap in envs}
        r: dict[str, Any] = {**common, "adapter_steps": k}
        if B in over:
            r["over_budget"] = over[B]
        r["constant_groups"] = {cap: art.summary.get("frac_constant_groups") for cap, art in adapters.items()}
        r["spent"] = {**fixed, "grpo": k * a.episodes_per_step * len(envs)}
        last = B == top
        comps: dict[str, dict[str, Any]] = {}
        experts: dict[str, dict[str, Any]] = {}
        if last or len(adapters) == 1:  # the single-adapter ablations, at the largest budget
            experts = {
                cap: b.eval(f"trace/eval/{cap}/{B}/{seed}", art.uri, a.target, a.held_out)
                for cap, art in adapters.items()
            }
            r["experts"] = {cap: e["pass@1"] for cap, e in experts.items()}
            best = max(experts, key=lambda c: experts[c]["pass@1"])
            r["single_best"] = {"capability": best, "pass@1": experts[best]["pass@1"]}
        if len(adapters) == 1:  # nothing to compose: every composition is the single adapter
            comps = {m: experts[next(iter(experts))] for m in ("router", "moe", "merge")}
        else:
            uris = [adapters[c].uri for c in sorted(adapters)]
            for method in ("router", "moe", "merge") if last else ("router", "moe"):
                extra = {"moe": {"target": a.target, "seeds": moe_seeds}} if method == "moe" else {}
                cfg = {"method": method, "base": base, "adapters": uris, "seed": seed, **extra}
                comp = b.run(f"trace/compose/{method}/{B}/{seed}", "compose", cfg).outputs["composition"]
                comps[method] = b.eval(f"trace/eval/{method}/{B}/{seed}", comp.uri, a.target, a.held_out)
        for m, e in comps.items():
            r[m] = e["pass@1"]
            r[f"families_{m}"] = e["families"]
        r["trace"] = r["moe"]
        if experts and len(experts) > 1:
            r["ablation"] = one_expert_ablation(base_ev["solved"], experts, comps)
        results[B] = r
    return results


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
        "by_expert": {cap: sum(bool(e["solved"].get(t)) for t in only) for cap, e in experts.items()},
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


ABLATIONS = ("merge", "single_best")  # measured at the largest budget only


def budget_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    top = max(r["budget"] for r in runs)
    for budget in sorted({r["budget"] for r in runs}):
        rs = [r for r in runs if r["budget"] == budget]
        row: dict[str, Any] = {"rollouts": budget}
        for m in METHODS:
            if (
                m in ABLATIONS and budget != top
            ):  # (a seed with one adapter has it at every budget: not a row)
                row[m] = mean_std([])
                continue
            vals = [r.get(m)["pass@1"] if isinstance(r.get(m), dict) else r.get(m) for r in rs]
            row[m] = mean_std(vals)
        rows.append(row)
    return rows


def family_table(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Largest budget: mean pass@1 per task family of base, GRPO-on-target and each composition."""
    top = max(r["budget"] for r in runs)
    rs = [r for r in runs if r["budget"] == top]
    out: dict[str, dict[str, float]] = {}
    for m in ("base", "grpo_target", "router", "moe", "merge"):
        per = [r.get(f"families_{m}") for r in rs if r.get(f"families_{m}")]
        if not per:
            continue
        out[m] = {f: round(statistics.fmean(p.get(f, 0.0) for p in per), 4) for f in sorted(per[0])}
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.combine:
        c = combine(a.combine)
        return finish(a, c["runs"], c["meta"], c["wall_s"], c["timings_s"])
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import tempfile

    store_dir = a.store or Path(tempfile.mkdtemp(prefix="sample-eff-"))
    b = Bench(store_dir, a.max_new_tokens)
    t0 = time.monotonic()
    base = b.run("base/import", "model", {"source": a.base}).outputs["model"].uri
    base_ev = b.eval("base/eval", base, a.target, a.held_out)
    runs: list[dict[str, Any]] = []
    for seed in a.train_seeds:
        none: dict[int, dict[str, Any]] = {B: {} for B in a.budgets}
        grpo = run_grpo_target(b, a, base, seed) if "grpo_target" in a.methods else none
        trace = run_trace(b, a, base, seed, base_ev) if "trace" in a.methods else none
        for budget in a.budgets:
            row: dict[str, Any] = {"budget": budget, "seed": seed, "base": base_ev["pass@1"]}
            row["families_base"] = base_ev["families"]
            row.update(grpo[budget])
            row.update(trace[budget])
            runs.append(row)
            print(json.dumps(row, default=str), file=sys.stderr, flush=True)
    meta = {
        "command": command(),
        "quick": a.quick,
        "held_out": a.held_out,
        "train_seeds": a.train_seeds,
        "settings": settings(a),
        "store": str(store_dir),
    }
    return finish(a, runs, meta, round(time.monotonic() - t0, 1), b.timings)


def settings(a) -> dict[str, Any]:
    return {
        "budgets": a.budgets,
        "episodes_per_step": a.episodes_per_step,
        "num_generations": a.num_generations,
        "learning_rate": a.learning_rate,
        "diagnosis_rollouts": a.diagnosis_rollouts,
        "calibration": a.calibration,
        "calibration_attempts": a.calibration_attempts,
        "calibrators": a.calibrators,
        "moe_seeds": a.moe_seeds,
        "methods": a.methods,
    }


def combine(paths: list[Path]) -> dict[str, Any]:
    """The runs of several result files (one per training seed, same settings and held-out seeds)."""
    docs = [json.loads(p.read_text()) for p in paths]
    for key in ("held_out", "settings"):
        if any(d.get(key) != docs[0].get(key) for d in docs):
            raise SystemExit(
                f"--combine: {key} differs between the result files; they are not one experiment"
            )
    return {
        "runs": [r for d in docs for r in d["runs"]],
        "meta": {
            "command": command(),
            "combined": [str(p) for p in paths],
            "quick": docs[0].get("quick"),
            "held_out": docs[0]["held_out"],
            "train_seeds": [s for d in docs for s in d["train_seeds"]],
            "settings": docs[0]["settings"],
            "store": [d.get("store") for d in docs],
        },
        "wall_s": [d.get("wall_s") for d in docs],
        "timings_s": {str(p): d.get("timings_s") for p, d in zip(paths, docs, strict=True)},
    }


def finish(a, runs, meta, wall, timings) -> int:
    rows = budget_rows(runs)
    top = max(r["budget"] for r in runs)
    res = {
        "benchmark": "sample_efficiency",
        **meta,
        "budgets": rows,
        "gain_ratio": {str(r["rollouts"]): gain_ratio(r) for r in rows},
        "families_at_largest_budget": family_table(runs),
        "ablation_at_largest_budget": [
            {
                "seed": r["seed"],
                **r.get("ablation", {}),
                "experts": r.get("experts"),
                "single_best": r.get("single_best"),
            }
            for r in runs
            if r["budget"] == top
        ],
        "runs": runs,
        "timings_s": timings,
        "wall_s": wall,
    }
    write_result(a.out, res)
    plot(rows, a.plot)
    print_budgets(rows)
    print_families(res["families_at_largest_budget"])
    print(f"\nJSON: {a.out}   plot: {a.plot}   wall {res['wall_s']} s")
    return 0


def print_families(fam: dict[str, dict[str, float]]) -> None:
    if not fam:
        return
    names = sorted({f for per in fam.values() for f in per})
    print("\npass@1 per task family at the largest budget (mean over training seeds)")
    print_table(["method", *names], [[m, *(f"{per.get(f, 0):.2f}" for f in names)] for m, per in fam.items()])


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
        ("merge", "x"),
        ("single_best", "^"),
    ):
        pts = [
            (x, r[m]["mean"], r[m]["std"] or 0.0)
            for x, r in zip(xs, rows, strict=True)
            if r[m]["mean"] is not None
        ]
        if pts:  # the ablations (merge, single best adapter) are points at the largest budget
            px, py, pe = zip(*pts, strict=True)
            ax.errorbar(px, py, yerr=pe, fmt=style, capsize=3, label=m)
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
