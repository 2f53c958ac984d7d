"""pass@1 and pass^k over rollouts, as τ²-bench computes them (src/tau2/metrics/agent_metrics.py).

A task succeeds when |reward − 1| ≤ 1e-6. For a task with c successes out of n trials,
pass^k = C(c, k) / C(n, k); a group's pass^k is the unweighted mean over its tasks. Each task uses its own n;
with uneven trial counts the largest k reported is the smallest n of any task (τ²-bench lowers max k the same
way), so no value is ever NaN. Used by `eval` (groups = task families) and `ingest` (groups = domains).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

SUCCESS_TOL = 1e-6
REWARD_MIN, REWARD_MAX = 0.0, 1.0  # schemas/episode.v1.json; τ²-bench rewards are products of 0/1 checks


def reward_problem(reward: float) -> str | None:
    """Why a reward cannot be stored (NaN or ±Infinity would make every mean NaN), or None."""
    if not math.isfinite(reward):
        return f"{reward} is not a finite number; rewards are in [{REWARD_MIN:g}, {REWARD_MAX:g}]"
    if not REWARD_MIN <= reward <= REWARD_MAX:
        return f"{reward:g} is outside [{REWARD_MIN:g}, {REWARD_MAX:g}], the documented reward range"
    return None


def is_success(reward: float) -> bool:
    return abs(reward - 1.0) <= SUCCESS_TOL


def pass_hat_k(c: int, n: int, k: int) -> float:
    """pass^k for one task with c successes out of n trials: C(c, k) / C(n, k) (requires k <= n)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass^k needs 1 <= k <= n trials (k={k}, n={n})")
    return math.comb(c, k) / math.comb(n, k)


def summarize(
    rows: list[dict[str, Any]], group_key: str = "task_family", max_k: int | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-task rows). rows: dicts with task_id, success, reward, seed and `group_key`.

    The summary has tasks, episodes, mean_reward, pass@1, pass^k {k: value} overall and under
    `groups` per value of `group_key`; k runs from 1 to the smallest trial count (capped by max_k)."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[str(r["task_id"])].append(r)
    if not by_task:
        return {
            "tasks": 0,
            "episodes": 0,
            "mean_reward": None,
            "pass@1": None,
            "pass^k": {},
            "groups": {},
        }, []
    top = min(len(eps) for eps in by_task.values())
    if max_k is not None:
        top = min(top, max_k)
    ks = list(range(1, top + 1))
    per_task = []
    for tid, eps in by_task.items():
        c, n = sum(bool(e["success"]) for e in eps), len(eps)
        per_task.append(
            {
                "task_id": tid,
                group_key: eps[0].get(group_key),
                "seed": eps[0].get("seed"),
                "trials": n,
                "successes": c,
                "mean_reward": sum(e["reward"] for e in eps) / n,
                "pass_hat_k": {str(k): pass_hat_k(c, n, k) for k in ks},
            }
        )

    def agg(tasks: list[dict[str, Any]]) -> dict[str, Any]:
        n_eps = sum(t["trials"] for t in tasks)
        return {
            "tasks": len(tasks),
            "episodes": n_eps,
            "mean_reward": sum(t["mean_reward"] * t["trials"] for t in tasks) / n_eps,
            "pass@1": sum(t["successes"] / t["trials"] for t in tasks) / len(tasks),
            "pass^k": {str(k): sum(t["pass_hat_k"][str(k)] for t in tasks) / len(tasks) for k in ks},
        }

    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in per_task:
        groups[t[group_key] or "-"].append(t)
    summary = agg(per_task)
    summary["groups"] = {g: agg(ts) for g, ts in sorted(groups.items())}
    return summary, per_task
