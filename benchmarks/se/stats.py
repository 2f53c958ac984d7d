"""The table's arithmetic (mean ± std over training seeds, the gain ratio, the one-expert ablation) and the
paired bootstrap of TRACE's gain against GRPO-on-target's."""

from __future__ import annotations

import statistics
from typing import Any

from trace_cli.compose import METHODS as COMPOSE_METHODS  # the composition methods are named once, there

TRACE_METHODS = ("trace", *COMPOSE_METHODS)
METHODS = ("base", "grpo_target", *TRACE_METHODS, "single_best")
BOOTSTRAP_SAMPLES = 10000
BOOTSTRAP_SEED = 0


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
            if m == "single_best":  # its validation rollouts are charged: over budget, it is left out
                pool = [r for r in rs if not r.get("single_best_over_budget")]
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
    for m in ("base", "grpo_target", *COMPOSE_METHODS, "router_train", "moe_train"):
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


def paired_bootstrap(
    runs: list[dict[str, Any]], samples: int = BOOTSTRAP_SAMPLES, rng_seed: int = BOOTSTRAP_SEED
) -> dict[str, Any] | None:
    """The paired bootstrap of one budget's runs (one per training seed, each with the per-task outcomes
    `tasks_base`, `tasks_grpo_target` and `tasks_trace`): every resample draws the training seeds and the test
    tasks with replacement, both at once, and pairs TRACE and GRPO-on-target on the same seeds and tasks.

    Returns the point estimates and, over the resamples, the difference TRACE gain - GRPO gain (its one-sided
    90 % lower bound: the 10th percentile; and the two-sided 90 % interval) and the gain ratio (its 95 %
    interval, over the resamples where GRPO gained; `ratio_undefined` is the fraction where it did not).
    None when no seed has both methods' per-task outcomes (e.g. a file written before they were kept)."""
    import numpy as np

    rs = sorted(
        (r for r in runs if all(r.get(f"tasks_{m}") for m in ("base", "grpo_target", "trace"))),
        key=lambda r: r["seed"],
    )
    rs = [r for r in rs if not r.get("over_budget")]
    if not rs:
        return None
    tasks = sorted(
        set.intersection(*(set(r[f"tasks_{m}"]) for r in rs for m in ("base", "grpo_target", "trace")))
    )
    if not tasks:
        return None

    def matrix(m: str):
        return np.array([[r[f"tasks_{m}"][t] for t in tasks] for r in rs], dtype=float)

    base, grpo, trace = matrix("base"), matrix("grpo_target"), matrix("trace")
    n_seeds, n_tasks = base.shape
    rng = np.random.default_rng(rng_seed)
    # resample b counts seed s w_seed[b, s] times and task t w_task[b, t] times
    w_seed = np.stack(
        [np.bincount(i, minlength=n_seeds) for i in rng.integers(0, n_seeds, (samples, n_seeds))]
    )
    w_task = np.stack(
        [np.bincount(i, minlength=n_tasks) for i in rng.integers(0, n_tasks, (samples, n_tasks))]
    )

    def means(x):
        return np.einsum("bs,st,bt->b", w_seed, x, w_task) / (n_seeds * n_tasks)

    g_trace, g_grpo = means(trace - base), means(grpo - base)
    diff = g_trace - g_grpo
    ok = g_grpo > 1e-9
    ratio = g_trace[ok] / g_grpo[ok]
    point_t, point_g = float((trace - base).mean()), float((grpo - base).mean())
    return {
        "seeds": [r["seed"] for r in rs],
        "tasks": n_tasks,
        "samples": samples,
        "rng_seed": rng_seed,
        "trace_gain": round(point_t, 4),
        "grpo_gain": round(point_g, 4),
        "difference": {
            "mean": round(point_t - point_g, 4),
            "lower_90": round(float(np.percentile(diff, 10)), 4),
            "interval_90": [round(float(q), 4) for q in np.percentile(diff, [5, 95])],
        },
        "ratio": {
            "mean": round(point_t / point_g, 3) if point_g > 1e-9 else None,
            "interval_95": [round(float(q), 3) for q in np.percentile(ratio, [2.5, 97.5])]
            if ok.any()
            else None,
            "ratio_undefined": round(float(1 - ok.mean()), 4),
        },
    }


def bootstraps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """budget (as a string) -> paired_bootstrap of that budget's runs of one target."""
    return {
        str(b): paired_bootstrap([r for r in runs if r["budget"] == b])
        for b in sorted({r["budget"] for r in runs})
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """target -> its table (`budgets`), gain ratios, paired bootstrap per budget and the largest budget's
    families, ablation and routing."""
    targets: dict[str, Any] = {}
    for target in sorted({r.get("target", "shop") for r in runs}):
        rs = [r for r in runs if r.get("target", "shop") == target]
        top = max(r["budget"] for r in rs)
        rows = budget_rows(rs)
        last = [r for r in rs if r["budget"] == top]
        targets[target] = {
            "budgets": rows,
            "gain_ratio": {str(r["rollouts"]): r["gain_ratio"] for r in rows},
            "gain_ratio_train": {str(r["rollouts"]): r["gain_ratio_train"] for r in rows},
            "bootstrap": bootstraps(rs),
            "families_at_largest_budget": family_table(rs),
            "ablation_at_largest_budget": [
                {
                    "seed": r["seed"],
                    **r.get("ablation", {}),
                    "experts": r.get("experts"),
                    "single_best": r.get("single_best"),
                }
                for r in last
                if "experts" in r
            ],
            "routing_at_largest_budget": [
                {"seed": r["seed"], **(r.get("routing") or {})} for r in last if r.get("routing")
            ],
        }
    return targets
