"""How TRACE splits a budget between its environments, and what one configuration spent."""

from __future__ import annotations


def validation_episodes(steps: int, every: int, seeds: int) -> int:
    """Episodes an early-stopping run of `steps` steps plays on its validation seeds (before step 1, then every
    `every` steps)."""
    return (1 + steps // every) * seeds if seeds else 0


def plan_steps(
    budgets: list[int],
    fixed: int,
    reuse_steps: dict[str, int],
    per_step: int,
    validation: tuple[int, int] = (1, 0),
) -> dict[str, dict[int, dict[str, int]]]:
    """GRPO steps per accounting, budget and environment. `all`: what is left of B after the fixed cost is split
    between the environments, each first taking the steps its reused calibration episodes give (already paid),
    and paying its validation episodes (`validation` = (every, seeds); seeds 0: none); `training`: B training
    rollouts split between them (reused episodes are training rollouts)."""
    n = len(reuse_steps)
    every, val_seeds = validation
    plan: dict[str, dict[int, dict[str, int]]] = {"all": {}, "training": {}}
    for B in budgets:
        left = max(0, B - fixed) // n
        plan["all"][B] = {}
        for c, r in reuse_steps.items():
            k = r + left // per_step
            while k > r and (k - r) * per_step + validation_episodes(k, every, val_seeds) > left:
                k -= 1
            plan["all"][B][c] = k
        plan["training"][B] = {c: max(1, (B // n) // per_step) for c in reuse_steps}
        for c in reuse_steps:
            plan["all"][B][c] = max(1, plan["all"][B][c])
    return plan


def spent(
    fixed: dict[str, int],
    steps: dict[str, int],
    reuse_steps: dict[str, int],
    per_step: int,
    validation: dict[str, int] | None = None,
) -> dict[str, int]:
    """Rollouts one TRACE configuration cost: the fixed part, GRPO's newly generated and reused episodes (`steps`:
    the steps each adapter trained, fewer than planned when it stopped early), and the episodes that chose each
    adapter's step (`validation`)."""
    generated = sum(max(0, k - reuse_steps[c]) * per_step for c, k in steps.items())
    reused = sum(min(k, reuse_steps[c]) * per_step for c, k in steps.items())
    val = sum((validation or {}).values())
    total = sum(fixed.values()) + generated + val
    return {
        **fixed,
        "grpo_generated": generated,
        "grpo_reused": reused,
        "training": generated + reused,
        "validation": val,
        "total": total,
    }
