"""The printed tables and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import print_table

from se.stats import METHODS
from se.sweep import grid


def print_target(target: str, t: dict[str, Any]) -> None:
    print(f"\n== target {target} ==")
    print_budgets(t["budgets"])
    print_bootstrap(t.get("bootstrap") or {})
    print_families(t["families_at_largest_budget"])


def print_lr_sweep(sweep: dict[str, Any]) -> None:
    """The learning-rate sweep that chose each method's rate (pass@1 on its validation seeds)."""
    rates = [repr(lr) for lr in grid(sweep)]  # the record's keys are the rates' reprs
    print(
        f"\nlearning rate sweep on seeds {', '.join(sweep['measured_on'])} at {sweep['budget']} rollouts "
        f"(mean pass@1 over its runs; {sweep['rollouts']['total']} rollouts)"
    )
    rows = [
        [
            m,
            *(f"{per[lr]['mean']:.3f} ({per[lr]['runs']})" if lr in per else None for lr in rates),
            sweep["chosen"][m],
        ]
        for m, per in sweep["pass@1"].items()
    ]
    print_table(["method", *rates, "chosen"], rows)


def print_verdict(v: dict[str, Any]) -> None:
    """The pre-registered decision, applied (se.freeze.verdict)."""

    def num(x: Any, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    state = "HOLDS" if v["holds"] else ("does not hold" if v["complete"] else "incomplete")
    runs = ", ".join(f"{m} {n}" for m, n in v["runs"].items())
    print(
        f"\npre-registered decision ({v['rule']}): {state} — gain ratio {num(v['gain_ratio'], '.2f')}× "
        f"({'met' if v['ratio_met'] else 'not met'}), 90 % lower bound {num(v['difference_lower_90'], '+.3f')} "
        f"({'met' if v['lower_bound_met'] else 'not met'}); runs: {runs}"
    )


def print_bootstrap(boot: dict[str, Any]) -> None:
    """The paired bootstrap per budget (budgets whose runs have no per-task outcomes are skipped)."""
    rows = []
    for budget, b in boot.items():
        if not b:
            continue
        d, r = b["difference"], b["ratio"]
        ci = r["interval_95"]
        rows.append(
            [
                budget,
                len(b["seeds"]),
                b["tasks"],
                f"{b['trace_gain']:+.3f}",
                f"{b['grpo_gain']:+.3f}",
                f"{d['mean']:+.3f}",
                f"{d['lower_90']:+.3f}",
                None if r["mean"] is None else f"{r['mean']:.2f}x",
                None if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]",
                f"{r['ratio_undefined']:.3f}",
            ]
        )
    if not rows:
        return
    print("\npaired bootstrap over test tasks and training seeds (TRACE = the MoE; every rollout counted)")
    cols = ["rollouts", "seeds", "tasks", "TRACE gain", "GRPO gain", "difference", "90% lower", "ratio"]
    print_table([*cols, "ratio 95% CI", "P(GRPO gain<=0)"], rows)


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
