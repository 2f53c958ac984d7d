#!/usr/bin/env python
"""Sample efficiency (issues 16 and 23, the paper's headline): TRACE vs GRPO-on-target vs base at equal rollouts.

Targets: `shop-mixed` (τ²-bench's task structure: 1-4 requests per conversation, all-or-nothing; the target the
paper's claim is about) and `shop` (one capability per task family). From one base agent (default: the demo's,
examples/demo-base-agent), at every budget B:
- base:        the base agent, untrained;
- grpo_target: a GRPO LoRA adapter trained on the target with B rollouts;
- TRACE:       diagnose D of the base agent's own target rollouts; synthesize and calibrate one environment per
               selected capability on the base agent itself (a sequential test over up to 32 seeds x 8; a
               calibration that fails is skipped and charged the rollouts it ran); train one GRPO adapter per
               environment, whose first steps reuse the calibration's on-policy episodes (paid once); compose them:
               `moe` (ours, the headline `trace` column: token-level gates trained on the diagnosed conversations,
               each labelled with the expert whose capability it lacks, and the experts' own environments),
               `router` (the paper's) and `merge` (the consolidation ablation, largest budget).
Two accountings, side by side: **all** — every rollout counts (diagnosis, calibration, the MoE's expert
transcripts, GRPO), the spend is checked against B, and a row whose spend exceeds it is marked and left out of
the ratio; **training** — only training rollouts count (GRPO's, the reused calibration episodes among them), as
the paper counts, with the fixed cost on top (reported). One GRPO run per method, environment and training seed
gives every budget (`snapshot_steps`; lr_scheduler constant, so a snapshot after k steps is what a k-step run
trains). Every method is measured on the same held-out test seeds (never used by any training, diagnosis,
calibration or choice); `single_best` (the best single adapter, an ablation) is chosen on a disjoint validation
range. Routing accuracy of the MoE gates is measured on the base agent's own held-out conversations.

Prints tables and writes JSON: `targets.<target>.budgets` rows (rollouts, base, grpo_target, trace, router, moe,
merge, single_best, the `_train` columns of the training accounting, spent, grpo_constant_groups, gain_ratio),
per-family pass@1 at the largest budget, the ablation, every run, the commit, the command and the settings.

    python benchmarks/sample_efficiency.py --quick --target shop-mixed   # 1 seed, 2 small budgets, 100 test seeds
    # the full run, one process per target, training seed and method (one per core), combined at the end; a
    # process that is stopped resumes its GRPO run from its last checkpoint when started again on the same --store
    for s in 0 1 2; do OMP_NUM_THREADS=1 nohup python benchmarks/sample_efficiency.py --target shop-mixed \\
        --train-seeds $s --methods trace --store stores/mixed-$s --out results/se-mixed-trace-$s.json \\
        > se-mixed-trace-$s.log 2>&1 & done
    python benchmarks/sample_efficiency.py --combine results/se-mixed-*.json results/se-shop-*.json \\
        --out results/sample_efficiency_mixed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, Stages, command, print_table, write_result

TARGET_TRAIN = 300000  # target seeds for diagnosis and GRPO-on-target (disjoint from test and validation)
TRACE_METHODS = ("trace", "router", "moe", "merge")
METHODS = ("base", "grpo_target", "trace", "router", "moe", "merge", "single_best")
ACCOUNTINGS = {"all": "", "training": "_train"}  # accounting -> column suffix
MAX_TURNS = {"shop": 12, "shop-mixed": 16}
# option -> (default, default with --quick)
DEFAULTS = {
    "budgets": ("640,1280,2560", "640,1280"),
    "train_seeds": ("0,1,2", "0"),
    "held_out": ("500000:500200", "500000:500100"),
    "validation": ("600000:600100", "600000:600050"),
    "calibration": ("32x8", "16x8"),
    "moe_seeds": (16, 8),
}  # the target's own turn limit (synthesized environments: 12)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[-1:]),
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 training seed, budgets 640,1280, 100 test seeds, calibration 16x8",
    )
    ap.add_argument("--store", type=Path, default=None, help="store directory (default: a fresh temp dir)")
    ap.add_argument("--base", default=str(REPO / "examples" / "demo-base-agent"), help="base model source")
    ap.add_argument(
        "--target", default="shop-mixed,shop", help="target environments, comma-separated (shop-mixed, shop)"
    )
    ap.add_argument("--budgets", default=None, help="rollout budgets, comma-separated (640,1280,2560)")
    ap.add_argument("--train-seeds", default=None, help="training seeds per method (0,1,2)")
    ap.add_argument("--held-out", default=None, help="held-out test seeds A:B (500000:500200)")
    ap.add_argument(
        "--validation", default=None, help="validation seeds, to choose single_best (600000:600100)"
    )
    ap.add_argument("--diagnosis-rollouts", type=int, default=100, help="TRACE's target rollouts to diagnose")
    ap.add_argument(
        "--calibration", default=None, help="calibration seeds (at most) x rollouts per attempt (32x8)"
    )
    ap.add_argument("--calibration-look", type=int, default=8, help="sequential test: seeds per look")
    ap.add_argument("--calibration-attempts", type=int, default=4, help="calibration attempts at most")
    ap.add_argument(
        "--calibration-start",
        choices=("easiest", "default"),
        default="easiest",
        help="the difficulty level calibration starts from: the template's easiest (a base that lacks the "
        "capability is usually below the band at the default level) or its default",
    )
    ap.add_argument(
        "--methods",
        default="grpo_target,trace",
        help="trained methods to run (comma-separated subset of grpo_target,trace); the base is always measured",
    )
    ap.add_argument(
        "--moe-seeds", type=int, default=None, help="MoE gate transcripts per expert environment (16)"
    )
    ap.add_argument("--moe-steps", type=int, default=150, help="MoE gate training steps")
    ap.add_argument("--episodes-per-step", type=int, default=32, help="GRPO episodes per optimizer step")
    ap.add_argument("--num-generations", type=int, default=8, help="GRPO group size")
    ap.add_argument("--learning-rate", type=float, default=2e-3, help="GRPO learning rate (LoRA)")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default: results/sample_efficiency_mixed[_quick].json)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="PNG path (default: next to --out)")
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        default=None,
        metavar="JSON",
        help="no training: merge these result files (per target, seed or method) into one table",
    )
    a = ap.parse_args(argv)
    # --quick: smaller defaults; an option the command line names keeps its value
    for k, (full, quick) in DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if a.quick else full)
    a.targets = [t for t in a.target.split(",") if t]
    if not a.targets or set(a.targets) - set(MAX_TURNS):
        ap.error(f"--target: a comma-separated subset of {','.join(MAX_TURNS)}, not {a.target!r}")
    a.budgets = sorted(int(x) for x in a.budgets.split(","))
    a.train_seeds = [int(x) for x in a.train_seeds.split(",")]
    a.methods = [m for m in a.methods.split(",") if m]
    if not a.methods or set(a.methods) - {"grpo_target", "trace"}:
        ap.error(f"--methods: a comma-separated subset of grpo_target,trace, not {','.join(a.methods)!r}")
    a.cal_seeds, a.cal_rollouts = (int(x) for x in a.calibration.split("x"))
    a.out = a.out or RESULTS / (
        "sample_efficiency_mixed_quick.json" if a.quick else "sample_efficiency_mixed.json"
    )
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
            "rollouts": ro.uri,
        }


def solved(rollouts_dir: Path) -> dict[str, bool]:
    import duckdb

    rows = duckdb.sql(
        f"SELECT task_id, bool_and(success) FROM '{rollouts_dir / 'episodes.parquet'}' GROUP BY 1"
    )
    return {t: bool(s) for t, s in rows.fetchall()}


def families(rollouts_dir: Path) -> dict[str, float]:
    """pass@1 per task family (task ids are <env>-FAMILY-SEED)."""
    import duckdb

    rows = duckdb.sql(
        f"SELECT regexp_replace(task_id, '-[0-9]+$', '') AS family, avg(success::DOUBLE) "
        f"FROM '{rollouts_dir / 'episodes.parquet'}' GROUP BY 1 ORDER BY 1"
    )
    return {f: round(v, 4) for f, v in rows.fetchall()}


def grpo_cfg(a, env: str, model: str, steps: int, seed: int, max_turns: int) -> dict[str, Any]:
    return {
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
        "max_turns": max_turns,
        "checkpoint_every": 5,  # a stopped benchmark resumes its GRPO run (not part of the id)
        "require_learning": False,  # a budget too small to learn is a result, not an error
    }


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
    """Every episode an admitted environment's calibration ran (all attempts)."""
    import duckdb

    p = env_art.path / "calibration.parquet"
    return int(duckdb.sql(f"SELECT coalesce(sum(seeds * rollouts), 0) FROM '{p}'").fetchall()[0][0])


def run_grpo_target(b: Bench, a, target: str, base: str, seed: int) -> dict[int, dict[str, Any]]:
    """GRPO on the target: one run per training seed, the adapter after budget // episodes_per_step steps (the
    same under both accountings: every rollout is a training rollout)."""
    steps = {B: max(1, B // a.episodes_per_step) for B in a.budgets}
    cfg = grpo_cfg(a, target, base, max(steps.values()), seed, MAX_TURNS[target])
    cfg["seeds"] = f"{TARGET_TRAIN}:{TARGET_TRAIN + 100000}"
    arts = train_curve(b, f"{target}/grpo_target/{seed}", cfg, list(steps.values()))
    out = {}
    for B, k in steps.items():
        ev = b.eval(
            f"{target}/grpo_target/eval/{B}/{seed}",
            arts[k].uri,
            target,
            a.held_out,
            max_turns=MAX_TURNS[target],
        )
        out[B] = {
            "grpo_target": ev["pass@1"],
            "grpo_rollouts": k * a.episodes_per_step,
            "grpo_constant_groups": arts[k].summary.get("frac_constant_groups"),
            "families_grpo_target": ev["families"],
        }
    return out


def plan_steps(
    budgets: list[int], fixed: int, reuse_steps: dict[str, int], per_step: int
) -> dict[str, dict[int, dict[str, int]]]:
    """GRPO steps per accounting, budget and environment. `all`: what is left of B after the fixed cost is split
    between the environments, each first taking the steps its reused calibration episodes give (already paid);
    `training`: B training rollouts split between them (reused episodes are training rollouts)."""
    n = len(reuse_steps)
    plan: dict[str, dict[int, dict[str, int]]] = {"all": {}, "training": {}}
    for B in budgets:
        left = max(0, B - fixed) // n
        plan["all"][B] = {c: r + left // per_step for c, r in reuse_steps.items()}
        plan["training"][B] = {c: max(1, (B // n) // per_step) for c in reuse_steps}
        for c in reuse_steps:
            plan["all"][B][c] = max(1, plan["all"][B][c])
    return plan


def spent(
    fixed: dict[str, int], steps: dict[str, int], reuse_steps: dict[str, int], per_step: int
) -> dict[str, int]:
    """Rollouts one TRACE configuration cost: the fixed part, GRPO's newly generated and reused episodes."""
    generated = sum(max(0, k - reuse_steps[c]) * per_step for c, k in steps.items())
    reused = sum(min(k, reuse_steps[c]) * per_step for c, k in steps.items())
    total = sum(fixed.values()) + generated
    return {
        **fixed,
        "grpo_generated": generated,
        "grpo_reused": reused,
        "training": generated + reused,
        "total": total,
    }


def run_trace(
    b: Bench, a, target: str, base: str, seed: int, base_ev: dict[str, Any]
) -> dict[int, dict[str, Any]]:
    """TRACE at every budget and both accountings from one diagnosis, one calibration and one GRPO run per
    environment."""
    from trace_cli.errors import CheckFailed, TraceError

    mt = MAX_TURNS[target]
    per_step = a.episodes_per_step
    fixed = {"diagnosis": a.diagnosis_rollouts, "calibration": 0, "moe": 0}
    diag_seeds = f"{TARGET_TRAIN}:{TARGET_TRAIN + a.diagnosis_rollouts}"
    ro = b.run(
        f"{target}/trace/diagnosis-rollouts",
        "eval",
        {
            "model": base,
            "env": target,
            "seeds": diag_seeds,
            "max_new_tokens": a.max_new_tokens,
            "max_turns": mt,
        },
    ).outputs["rollouts"]
    diag = b.run(
        f"{target}/trace/diagnose", "diagnose", {"rollouts": ro.uri, "analyst": "rules", "seed": seed}
    )
    d_art = diag.outputs["diagnosis"]
    selected = list(d_art.summary.get("selected", []))
    envs: dict[str, Any] = {}
    failed: dict[str, int] = {}
    for cap in selected:
        try:
            out = b.run(
                f"{target}/trace/synthesize/{cap}/{seed}",
                "synthesize",
                {
                    "diagnosis": d_art.uri,
                    "capability": cap,
                    "target": target,
                    "tools": "needed",
                    "model": base,
                    "seed": seed,
                    **({"params": {"level": 0}} if a.calibration_start == "easiest" else {}),
                    "calibration": {
                        "seeds": a.cal_seeds,
                        "rollouts": a.cal_rollouts,
                        "look": a.calibration_look,
                        "max_attempts": a.calibration_attempts,
                        "max_new_tokens": a.max_new_tokens,
                        "max_completion_length": 1024,
                        "tokens": True,
                    },
                },
            )
        except CheckFailed as e:  # out of band at every level tried: skipped, charged what it ran
            ran = int((e.details or {}).get("rollouts_run") or 0)
            print(f"  {cap}: no environment ({ran} calibration rollouts): {e}", file=sys.stderr)
            fixed["calibration"] += ran
            failed[cap] = ran
            continue
        except TraceError as e:
            print(f"  {cap}: no environment ({e})", file=sys.stderr)
            failed[cap] = 0
            continue
        env_art = out.outputs["environment"]
        fixed["calibration"] += calibration_rollouts(env_art)
        envs[cap] = env_art
    common: dict[str, Any] = {
        "selected": selected,
        "environments": sorted(envs),
        "calibration_failed": failed,
        "calibrated_by": {c: "base" for c in envs},
    }
    if not envs:
        return {B: {**common, "spent": {**fixed, "total": sum(fixed.values())}} for B in a.budgets}
    order = [c for c in selected if c in envs]  # diagnosis rank: the gates' slot order
    fixed["moe"] = a.moe_seeds * len(envs) if len(envs) > 1 else 0
    reuse_steps = {
        c: ((envs[c].summary.get("calibration_rollouts") or {}).get("episodes", 0) // per_step) for c in order
    }
    plan = plan_steps(a.budgets, sum(fixed.values()), reuse_steps, per_step)
    curves: dict[str, dict[int, Any]] = {}
    for cap in order:
        wanted = sorted({plan[acc][B][cap] for acc in plan for B in a.budgets})
        cfg = grpo_cfg(a, envs[cap].uri, base, 1, seed, 12)
        cfg["reuse_calibration"] = reuse_steps[cap]
        curves[cap] = train_curve(b, f"{target}/trace/train/{cap}/{seed}", cfg, wanted)
    top = max(a.budgets)
    moe_seeds = f"{TARGET_TRAIN + 50000}:{TARGET_TRAIN + 50000 + a.moe_seeds}"
    composed: dict[tuple, dict[str, dict[str, Any]]] = {}

    def compose_all(
        adapters: dict[str, Any], methods: tuple[str, ...], tag: str
    ) -> dict[str, dict[str, Any]]:
        """Router, MoE (and merge) of these adapters, evaluated on the test seeds (cached per adapter set)."""
        key = tuple(adapters[c].id for c in order)
        have = composed.setdefault(key, {})
        uris = [adapters[c].uri for c in order]
        for method in methods:
            if method in have:
                continue
            extra = {}
            if method == "moe":
                extra = {
                    "moe": {
                        "target": target,
                        "seeds": moe_seeds,
                        "diagnosis": d_art.uri,
                        "test_rollouts": base_ev["rollouts"],
                        "steps": a.moe_steps,
                        "max_turns": 12,
                    }
                }
            cfg = {"method": method, "base": base, "adapters": uris, "seed": seed, **extra}
            comp = b.run(f"{target}/trace/compose/{method}/{tag}/{seed}", "compose", cfg).outputs[
                "composition"
            ]
            ev = b.eval(
                f"{target}/trace/eval/{method}/{tag}/{seed}", comp.uri, target, a.held_out, max_turns=mt
            )
            if method == "moe":
                s = comp.summary
                ev["routing"] = {
                    k: s.get(k)
                    for k in (
                        "routing_accuracy",
                        "routing_accuracy_per_expert",
                        "routing_test_episodes",
                        "transcripts",
                    )
                }
            have[method] = ev
        return have

    results: dict[int, dict[str, Any]] = {}
    for B in a.budgets:
        r: dict[str, Any] = {**common}
        for acc, sfx in ACCOUNTINGS.items():
            steps = plan[acc][B]
            adapters = {c: curves[c][steps[c]] for c in order}
            sp = spent(fixed, steps, reuse_steps, per_step)
            r[f"spent{sfx}"] = sp
            r[f"adapter_steps{sfx}"] = steps
            r[f"constant_groups{sfx}"] = {c: adapters[c].summary.get("frac_constant_groups") for c in order}
            over = acc == "all" and sp["total"] > B
            if over:
                r["over_budget"] = (
                    f"spent {sp['total']} rollouts of {B} (the fixed cost alone is {sum(fixed.values())})"
                )
            last = B == top and acc == "all"
            if len(order) == 1:  # nothing to compose: every composition is the single adapter
                ev = b.eval(
                    f"{target}/trace/eval/{order[0]}/{acc}-{B}/{seed}",
                    adapters[order[0]].uri,
                    target,
                    a.held_out,
                    max_turns=mt,
                )
                comps = {m: ev for m in ("router", "moe", "merge")}
            else:
                methods = ("router", "moe", "merge") if last else ("router", "moe")
                comps = compose_all(adapters, methods, f"{acc}-{B}")
            for m, e in comps.items():
                if m == "merge" and not last:
                    continue
                r[f"{m}{sfx}"] = e["pass@1"]
                r[f"families_{m}{sfx}"] = e["families"]
                if e.get("routing"):
                    r[f"routing{sfx}"] = e["routing"]
            r[f"trace{sfx}"] = r[f"moe{sfx}"]
            if last:  # single adapters: chosen on validation seeds, measured on the test seeds

                def alone(kind: str, seeds: str, B=B, adapters=adapters) -> dict[str, dict[str, Any]]:
                    """Each adapter on its own, on these target seeds."""
                    return {
                        c: b.eval(
                            f"{target}/trace/{kind}/{c}/{B}/{seed}",
                            adapters[c].uri,
                            target,
                            seeds,
                            max_turns=mt,
                        )
                        for c in order
                    }

                val, experts = alone("val", a.validation), alone("eval", a.held_out)
                best = max(order, key=lambda c: val[c]["pass@1"])
                r["experts"] = {c: e["pass@1"] for c, e in experts.items()}
                r["experts_validation"] = {c: v["pass@1"] for c, v in val.items()}
                r["single_best"] = {
                    "capability": best,
                    "pass@1": experts[best]["pass@1"],
                    "chosen_on": a.validation,
                }
                if len(experts) > 1:
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


def _value(v: Any) -> Any:
    return v["pass@1"] if isinstance(v, dict) else v


def budget_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per budget: mean +- std over training seeds of every method in both accountings, the spend, and
    the gain ratio (a run whose spend exceeds its budget is left out of `trace`/`router`/`moe` and counted)."""
    rows = []
    top = max(r["budget"] for r in runs)
    for budget in sorted({r["budget"] for r in runs}):
        rs = [r for r in runs if r["budget"] == budget]
        within = [r for r in rs if not r.get("over_budget")]
        row: dict[str, Any] = {"rollouts": budget}
        for m in METHODS:
            if m in ABLATIONS and budget != top:
                row[m] = mean_std([])
                continue
            pool = within if m in TRACE_METHODS else rs
            row[m] = mean_std([_value(r.get(m)) for r in pool])
        for m in ("trace", "router", "moe"):
            row[f"{m}_train"] = mean_std([_value(r.get(f"{m}_train")) for r in rs])
        row["spent"] = {
            "all": mean_std([(r.get("spent") or {}).get("total") for r in rs if r.get("spent")]),
            "training": mean_std(
                [(r.get("spent_train") or {}).get("training") for r in rs if r.get("spent_train")]
            ),
            "fixed": mean_std(
                [
                    sum((r.get("spent") or {}).get(k, 0) for k in ("diagnosis", "calibration", "moe"))
                    for r in rs
                    if r.get("spent")
                ]
            ),
        }
        row["over_budget_runs"] = sum(1 for r in rs if r.get("over_budget"))
        row["grpo_constant_groups"] = mean_std([r.get("grpo_constant_groups") for r in rs])
        row["gain_ratio"] = gain_ratio(row)
        row["gain_ratio_train"] = gain_ratio(row, "trace_train")
        rows.append(row)
    return rows


def family_table(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Largest budget: mean pass@1 per task family of base, GRPO-on-target and each composition."""
    top = max(r["budget"] for r in runs)
    rs = [r for r in runs if r["budget"] == top]
    out: dict[str, dict[str, float]] = {}
    for m in ("base", "grpo_target", "router", "moe", "merge", "router_train", "moe_train"):
        per = [r.get(f"families_{m}") for r in rs if r.get(f"families_{m}")]
        if not per:
            continue
        out[m] = {f: round(statistics.fmean(p.get(f, 0.0) for p in per), 4) for f in sorted(per[0])}
    return out


def gain_ratio(row: dict[str, Any], trace: str = "trace") -> float | None:
    """TRACE's gain over base divided by GRPO-on-target's (the paper: 2.9x); None when GRPO gained nothing or a
    column has no run."""
    b, g, t = (row[m]["mean"] for m in ("base", "grpo_target", trace))
    return round((t - b) / (g - b), 3) if None not in (b, g, t) and g - b > 1e-9 else None


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
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


def settings(a) -> dict[str, Any]:
    return {
        "budgets": a.budgets,
        "episodes_per_step": a.episodes_per_step,
        "num_generations": a.num_generations,
        "learning_rate": a.learning_rate,
        "diagnosis_rollouts": a.diagnosis_rollouts,
        "calibration": a.calibration,
        "calibration_look": a.calibration_look,
        "calibration_attempts": a.calibration_attempts,
        "calibration_start": a.calibration_start,
        "moe_seeds": a.moe_seeds,
        "moe_steps": a.moe_steps,
        "max_new_tokens": a.max_new_tokens,
        "validation": a.validation,
        "base": str(a.base),
    }


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
    meta = {
        "commit": git_commit(),
        "dirty": git_dirty(),
        "command": command(),
        "quick": a.quick,
        "held_out": a.held_out,
        "train_seeds": a.train_seeds,
        "targets_run": a.targets,
        "methods": a.methods,
        "settings": settings(a),
        "store": str(store_dir),
    }
    base = b.run("base/import", "model", {"source": a.base}).outputs["model"].uri
    runs: list[dict[str, Any]] = []
    for target in a.targets:
        mt = MAX_TURNS[target]
        base_ev = b.eval(f"{target}/base/eval", base, target, a.held_out, max_turns=mt)
        for seed in a.train_seeds:
            none: dict[int, dict[str, Any]] = {B: {} for B in a.budgets}
            grpo = run_grpo_target(b, a, target, base, seed) if "grpo_target" in a.methods else none
            trace = run_trace(b, a, target, base, seed, base_ev) if "trace" in a.methods else none
            for budget in a.budgets:
                row: dict[str, Any] = {
                    "target": target,
                    "budget": budget,
                    "seed": seed,
                    "base": base_ev["pass@1"],
                }
                row["families_base"] = base_ev["families"]
                row.update(grpo[budget])
                row.update(trace[budget])
                runs.append(row)
                print(json.dumps(row, default=str), file=sys.stderr, flush=True)
            # what is done so far is kept (a long run stopped later still has these)
            write_result(a.out.with_suffix(".partial.json"), {**meta, "runs": runs})
    return finish(a, runs, meta, round(time.monotonic() - t0, 1), b.timings)


def combine(paths: list[Path]) -> dict[str, Any]:
    """The runs of several result files (per target, training seed or method: same settings and test seeds);
    rows of one (target, budget, seed) from different files (e.g. --methods grpo_target and trace) are merged."""
    docs = [json.loads(p.read_text()) for p in paths]
    for key in ("held_out", "settings"):
        if any(d.get(key) != docs[0].get(key) for d in docs):
            raise SystemExit(
                f"--combine: {key} differs between the result files; they are not one experiment"
            )
    merged: dict[tuple, dict[str, Any]] = {}
    for d in docs:
        for r in d["runs"]:
            key = (r.get("target", "shop"), r["budget"], r["seed"])
            merged.setdefault(key, {}).update(r)
    return {
        "runs": list(merged.values()),
        "meta": {
            "commit": docs[0].get("commit"),
            "commits": sorted({str(d.get("commit")) for d in docs}),
            "command": command(),
            "combined": [str(p) for p in paths],
            "commands": [d.get("command") for d in docs],
            "quick": docs[0].get("quick"),
            "held_out": docs[0]["held_out"],
            "train_seeds": sorted({s for d in docs for s in d["train_seeds"]}),
            "settings": docs[0]["settings"],
            "store": [d.get("store") for d in docs],
        },
        "wall_s": [d.get("wall_s") for d in docs],
        "timings_s": {str(p): d.get("timings_s") for p, d in zip(paths, docs, strict=True)},
    }


def finish(a, runs, meta, wall, timings) -> int:
    targets: dict[str, Any] = {}
    for target in sorted({r.get("target", "shop") for r in runs}):
        rs = [r for r in runs if r.get("target", "shop") == target]
        top = max(r["budget"] for r in rs)
        rows = budget_rows(rs)
        targets[target] = {
            "budgets": rows,
            "gain_ratio": {str(r["rollouts"]): r["gain_ratio"] for r in rows},
            "gain_ratio_train": {str(r["rollouts"]): r["gain_ratio_train"] for r in rows},
            "families_at_largest_budget": family_table(rs),
            "ablation_at_largest_budget": [
                {
                    "seed": r["seed"],
                    **r.get("ablation", {}),
                    "experts": r.get("experts"),
                    "single_best": r.get("single_best"),
                }
                for r in rs
                if r["budget"] == top and "experts" in r
            ],
            "routing_at_largest_budget": [
                {"seed": r["seed"], **(r.get("routing") or {})}
                for r in rs
                if r["budget"] == top and r.get("routing")
            ],
        }
    res = {
        "benchmark": "sample_efficiency",
        **meta,
        "targets": targets,
        "runs": runs,
        "timings_s": timings,
        "wall_s": wall,
    }
    write_result(a.out, res)
    plot(targets, a.plot)
    for target, t in targets.items():
        print(f"\n== target {target} ==")
        print_budgets(t["budgets"])
        print_families(t["families_at_largest_budget"])
    print(f"\nJSON: {a.out}   plot: {a.plot}   wall {res['wall_s']} s")
    return 0


def print_families(fam: dict[str, dict[str, float]]) -> None:
    if not fam:
        return
    names = sorted({f for per in fam.values() for f in per})
    print("\npass@1 per task family at the largest budget (mean over training seeds)")
    short = [n.split("-", 1)[-1] if n.startswith("shop-mixed-") else n for n in names]
    print_table(["method", *short], [[m, *(f"{per.get(f, 0):.2f}" for f in names)] for m, per in fam.items()])


def print_budgets(rows: list[dict[str, Any]]) -> None:
    """pass@1 mean±std of every method at every budget, both accountings, the spend and the gain ratios."""

    def cell(v: dict[str, Any]) -> str | None:
        return None if v["mean"] is None else f"{v['mean']:.3f}±{v['std']:.3f}"

    def ratio(x: float | None) -> str | None:
        return None if x is None else f"{x:.2f}x"

    print("\nall rollouts counted (diagnosis, calibration, MoE transcripts, GRPO)")
    table = []
    for r in rows:
        spend = r["spent"]["all"]["mean"]
        over = f" ({r['over_budget_runs']} over)" if r["over_budget_runs"] else ""
        table.append(
            [
                r["rollouts"],
                *(cell(r[m]) for m in METHODS),
                f"{spend:.0f}{over}" if spend else None,
                ratio(r["gain_ratio"]),
            ]
        )
    print_table(["rollouts", *METHODS, "spent", "gain ratio"], table)
    print("\ntraining rollouts only (the paper's accounting; TRACE's fixed cost on top)")
    table = []
    for r in rows:
        fixed = r["spent"]["fixed"]["mean"]
        table.append(
            [
                r["rollouts"],
                cell(r["base"]),
                cell(r["grpo_target"]),
                cell(r["trace_train"]),
                cell(r["router_train"]),
                f"{fixed:.0f}" if fixed is not None else None,
                cell(r["grpo_constant_groups"]),
                ratio(r["gain_ratio_train"]),
            ]
        )
    print_table(
        [
            "rollouts",
            "base",
            "grpo_target",
            "trace",
            "router",
            "fixed cost",
            "grpo const. groups",
            "gain ratio",
        ],
        table,
    )


def plot(targets: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(targets), figsize=(6.4 * len(targets), 4.2), dpi=110, squeeze=False)
    for ax, (target, t) in zip(axes[0], targets.items(), strict=True):
        rows = t["budgets"]
        xs = [r["rollouts"] for r in rows]
        for m, style in (
            ("base", "k--"),
            ("grpo_target", "o-"),
            ("router", "s-"),
            ("moe", "D-"),
            ("trace_train", "D:"),
            ("merge", "x"),
            ("single_best", "^"),
        ):
            pts = [
                (x, r[m]["mean"], r[m]["std"] or 0.0)
                for x, r in zip(xs, rows, strict=True)
                if r[m]["mean"] is not None
            ]
            if pts:
                px, py, pe = zip(*pts, strict=True)
                label = "moe (training rollouts only)" if m == "trace_train" else m
                ax.errorbar(px, py, yerr=pe, fmt=style, capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(target)
        ax.set_xlabel("rollouts (all counted; dotted: training only)")
        ax.set_ylabel("pass@1 on held-out test seeds")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
