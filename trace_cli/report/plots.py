"""The report's figures (matplotlib, Agg backend), each returned as PNG bytes."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SELECTED, REJECTED, BASE = "#2b7bba", "#b8b8b8", "#888888"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def diagnosis(d: dict[str, Any]) -> bytes:
    """Δ and coverage per capability, selected ones coloured, with the two selection thresholds."""
    caps = sorted(d["capabilities"], key=lambda c: (not c["selected"], -c["delta"]))
    names = [c["name"] for c in caps]
    colors = [SELECTED if c["selected"] else REJECTED for c in caps]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.45 * len(caps) + 1.5), sharey=True)
    y = range(len(caps))
    a1.barh(y, [c["delta"] for c in caps], xerr=[c["delta_std"] for c in caps], color=colors)
    a1.axvline(d["delta_min"], color="k", ls="--", lw=1, label=f"Δ ≥ {d['delta_min']:g}")
    a1.set_xlabel("Δ = ER⁻ − ER⁺")
    a1.set_yticks(list(y), names)
    a1.invert_yaxis()
    a1.legend(loc="lower right", fontsize=8)
    a2.barh(y, [c["coverage"] for c in caps], color=colors)
    a2.axvline(d["coverage_min"], color="k", ls="--", lw=1, label=f"coverage ≥ {d['coverage_min']:g}")
    a2.set_xlabel("coverage")
    a2.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"diagnosis {d['name']} ({d['analyst']})", fontsize=10)
    return _png(fig)


def calibration(envs: list[dict[str, Any]]) -> bytes:
    """Success of each calibration attempt per environment, against its band."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, e in enumerate(envs):
        lo, hi = e["band"]
        ax.add_patch(plt.Rectangle((i - 0.4, lo), 0.8, hi - lo, color="#cfe8cf", zorder=0))
        xs = [i - 0.3 + 0.6 * k / max(1, len(e["attempts"]) - 1) for k in range(len(e["attempts"]))]
        ys = [a["success"] for a in e["attempts"]]
        ax.plot(xs, ys, "o-", color=SELECTED)
        for x, a in zip(xs, e["attempts"], strict=True):
            ax.annotate(
                f"L{a['level']}", (x, a["success"]), fontsize=7, textcoords="offset points", xytext=(0, 5)
            )
    ax.set_xticks(range(len(envs)), [e["name"] for e in envs], rotation=15, fontsize=8)
    ax.set_xlim(-0.5, len(envs) - 0.5)
    ax.set_ylim(0, 1)
    ax.set_ylabel("policy success")
    ax.set_title("calibration attempts (green: target band; L = difficulty level)", fontsize=10)
    return _png(fig)


def rewards(curves: list[dict[str, Any]]) -> bytes:
    """GRPO mean reward (solid) and success (dashed) per optimizer step, one colour per adapter."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for c in curves:
        (line,) = ax.plot(c["steps"], c["reward"], "-o", ms=3, label=f"{c['name']} reward")
        if any(v is not None for v in c["success"]):
            ax.plot(c["steps"], c["success"], "--", color=line.get_color(), label=f"{c['name']} success")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean over the step's rollouts")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("GRPO training curves", fontsize=10)
    return _png(fig)


def families(e: dict[str, Any]) -> bytes:
    """pass@1 per task family (and overall) for every model evaluated on one environment."""
    runs = e["runs"]
    fams = sorted({f for r in runs for f in r["families"]}) + ["ALL"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(fams) + 2), 3.5))
    width = 0.8 / max(1, len(runs))
    for i, r in enumerate(runs):
        vals = [r["families"].get(f) if f != "ALL" else r["pass@1"] for f in fams]
        xs = [k - 0.4 + width * (i + 0.5) for k in range(len(fams))]
        label = r["name"]
        ks = sorted(r["pass^k"], key=int)
        if ks and int(ks[-1]) > 1:
            label += f" (pass^{ks[-1]} {r['pass^k'][ks[-1]]:.2f})"
        ax.bar(xs, [v or 0 for v in vals], width, label=label)
    ax.set_xticks(range(len(fams)), fams, rotation=15, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1")
    ax.legend(fontsize=7)
    ax.set_title(f"{e['env']}: pass@1 per task family", fontsize=10)
    return _png(fig)


def routing(comps: list[dict[str, Any]]) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    experts = sorted({x for c in comps for x in c["per_expert"]})
    width = 0.8 / max(1, len(comps))
    for i, c in enumerate(comps):
        xs = [k - 0.4 + width * (i + 0.5) for k in range(len(experts) + 1)]
        vals = [c["per_expert"].get(x, 0) for x in experts] + [c["overall"] or 0]
        ax.bar(xs, vals, width, label=f"{c['name']} ({c['method']})")
    ax.set_xticks(range(len(experts) + 1), experts + ["overall"], rotation=15, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("routing accuracy (held-out turns)")
    ax.legend(fontsize=7)
    return _png(fig)


def sample_efficiency(panel: dict[str, Any]) -> bytes:
    """Held-out pass@1 against rollouts for every method of one target (mean ± std over training seeds), from
    collect.read_sample_efficiency."""
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = panel["rollouts"]
    for m, v in panel["methods"].items():
        pts = [(x, y, e) for x, y, e in zip(xs, v["mean"], v["std"], strict=True) if y is not None]
        if not pts:
            continue
        px, py, pe = zip(*pts, strict=True)
        style = "--" if m == "base" else (":" if m.endswith("_train") else "-")
        label = "trace (training rollouts only)" if m == "trace_train" else m
        ax.errorbar(px, py, yerr=pe, marker="o", ls=style, capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollouts (all counted; dotted: training only)")
    ax.set_ylabel("held-out pass@1")
    ax.legend(fontsize=8)
    ax.set_title(f"sample efficiency: {panel['target']}", fontsize=10)
    return _png(fig)
