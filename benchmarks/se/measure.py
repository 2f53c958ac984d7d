"""Stages in one store (common.Stages) and what an evaluation measured, read through the store's index views."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from common import Stages


class Bench(Stages):
    """Stages in one store, timed, and the held-out evaluation every method gets."""

    def __init__(self, store_dir: Path, max_new_tokens: int):
        super().__init__(store_dir)
        self.max_new_tokens = max_new_tokens

    def eval(self, label: str, model: str, env: str, seeds: str, **kw) -> dict[str, Any]:
        """pass@1, the outcome of every task (its mean success over trials), pass@1 per task family and the
        rollouts' uri."""
        cfg = {"model": model, "env": env, "seeds": seeds, "max_new_tokens": self.max_new_tokens, **kw}
        out = self.run(label, "eval", cfg)
        ev = out.outputs["eval"]
        outcomes = task_outcomes(self.store, ev.id)
        return {
            "pass@1": ev.summary["pass@1"],
            "episodes": ev.summary["episodes"],
            "tasks": outcomes,
            "solved": {t: v >= 1.0 for t, v in outcomes.items()},
            "families": families(outcomes),
            "rollouts": out.outputs["rollouts"].uri,
        }

    def calibration_rollouts(self, env_art) -> int:
        """Every episode an admitted environment's calibration ran (all attempts)."""
        _, rows = self.store.query(
            "SELECT coalesce(sum(seeds * rollouts), 0) FROM calibration WHERE artifact_id = ?", [env_art.id]
        )
        return int(rows[0][0])


def task_outcomes(store, eval_id: str) -> dict[str, float]:
    """task id -> successes / trials of one eval artifact (the `eval_results` view)."""
    _, rows = store.query(
        "SELECT task_id, sum(successes) / sum(trials) FROM eval_results WHERE artifact_id = ? GROUP BY 1 "
        "ORDER BY 1",
        [eval_id],
    )
    return {t: float(v) for t, v in rows}


def families(outcomes: dict[str, float]) -> dict[str, float]:
    """pass@1 per task family (task ids are <env>-FAMILY-SEED; τ²-bench's are bare task ids: one family)."""
    per: dict[str, list[float]] = {}
    for t, v in outcomes.items():
        per.setdefault("tau2" if "-" not in t else re.sub(r"-[0-9]+$", "", t), []).append(v)
    return {f: round(statistics.fmean(vs), 4) for f, vs in sorted(per.items())}
