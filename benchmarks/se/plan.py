"""How TRACE splits a budget between its environments, and what one configuration spent."""

from __future__ import annotations


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
