"""The learning-rate sweep (issue 31's fair baseline): the same small sweep for GRPO-on-target and for TRACE,
measured on validation seeds, never on the test seeds.

A sweep is a set of `--lr-sweep` result files (one process per method and rate: the trained methods are
measured on `--validation`, the largest budget is the one that counts). `choose` reads them for a confirmatory
run: each method's rate is the one with the best mean pass@1 over the sweep's runs (training seeds, targets) at
the largest budget, ties going to the smaller rate; the table, the choice and what the sweep cost (every
training rollout of the runs that chose, and their validation episodes) are recorded in the result
(`lr_sweep`). Refused (exit 2): a file that is not a sweep result, a dirty one, a sweep whose validation seeds
overlap the test seeds, one of another experiment (settings other than the learning rate differ), or one that
leaves a method without a rate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from se.results import Refused, read
from se.settings import RECORDED, TRAINED, Settings
from trace_cli.config.seeds import parse_seeds

VARIES = (
    "learning_rate",
    "purpose",
    "budgets",
)  # what may differ between the sweep and the run it chooses for
# the settings a GRPO-on-target sweep run depends on (TRACE's diagnosis, calibration, early stopping and gates
# do not touch it): its result stands for a run whose TRACE settings differ
GRPO_SETTINGS = ("episodes_per_step", "num_generations", "max_new_tokens", "validation", "base")
TRAINING = {
    "grpo_target": lambda r: r.get("grpo_rollouts") or 0,
    "trace": lambda r: (r.get("spent") or {}).get("total", 0),
}


def _rate_of(doc: dict[str, Any], method: str) -> float:
    lr = doc["settings"]["learning_rate"]
    return float(lr[method] if isinstance(lr, dict) else lr)


def choose(paths: list[Path], s: Settings) -> tuple[dict[str, float], dict[str, Any]]:
    """Each trained method's learning rate from the sweep files, and the `lr_sweep` record (see the module)."""
    test = set(parse_seeds(s.held_out))
    mine = s.record()
    table: dict[str, dict[str, list[float]]] = {m: {} for m in TRAINED}
    cost = {m: 0 for m in TRAINED}
    files, ranges, top = [], set(), max(s.budgets)
    for p in paths:
        d = read(p)
        if d["settings"].get("purpose") != "lr_sweep":
            raise Refused(f"--learning-rate-from: {p} is not a --lr-sweep result")
        if d.get("dirty") is not False:
            raise Refused(f"--learning-rate-from: {p} comes from a dirty checkout (or does not say)")
        if test & set(parse_seeds(d["held_out"])):
            raise Refused(
                f"--learning-rate-from: {p} was measured on seeds {d['held_out']}, which overlap the test seeds "
                f"{s.held_out}: a rate must never be chosen on test seeds"
            )
        keys = set(RECORDED) - set(VARIES)
        if d.get("methods") == ["grpo_target"]:  # only what GRPO on the target depends on
            keys &= set(GRPO_SETTINGS)
        other = sorted(k for k in keys if d["settings"].get(k) != mine.get(k))
        if other or max(d["settings"]["budgets"]) != top:
            why = ", ".join(other) if other else f"largest budget {max(d['settings']['budgets'])} != {top}"
            raise Refused(f"--learning-rate-from: {p} is a sweep of another experiment ({why})")
        files.append({"file": str(p), "commit": d["commit"], "dirty": d["dirty"]})
        ranges.add(d["held_out"])
        for r in d["runs"]:
            if r["budget"] != top:
                continue
            for m in d.get("methods") or ():
                if r.get(m) is None:  # a row's column of a method is its pass@1 (TRACE's: the MoE's)
                    continue
                table[m].setdefault(repr(_rate_of(d, m)), []).append(float(r[m]))
                cost[m] += int(TRAINING[m](r)) + len(r.get(f"tasks_{m}") or ())
    missing = [m for m in TRAINED if not table[m]]
    if missing:
        raise Refused(f"--learning-rate-from: no sweep run of {', '.join(missing)} at budget {top}")
    summary = {
        m: {
            lr: {"mean": round(sum(v) / len(v), 4), "runs": len(v)}
            for lr, v in sorted(t.items(), key=lambda x: float(x[0]))
        }
        for m, t in table.items()
    }
    chosen = {m: float(max(summary[m], key=lambda lr: (summary[m][lr]["mean"], -float(lr)))) for m in TRAINED}
    record = {
        "files": files,
        "measured_on": sorted(ranges),
        "budget": top,
        "pass@1": summary,
        "chosen": chosen,
        "rollouts": {**cost, "total": sum(cost.values())},
    }
    return chosen, record


def grid(record: dict[str, Any]) -> list[float]:
    """The rates a sweep record (`lr_sweep`) measured, ascending."""
    return sorted({float(lr) for per in record["pass@1"].values() for lr in per})


def apply(s: Settings) -> Settings:
    """`s` with the learning rates its `--learning-rate-from` sweep chose (unchanged without one)."""
    if not s.learning_rate_from:
        return s
    rates, record = choose(list(s.learning_rate_from), s)
    return dataclasses.replace(s, learning_rate=rates, lr_sweep=record)
