"""`shop-ladder` (issue 44): the mechanism test's compounding target, on the shop's world, tools, user and verifier.

A separate package from `envs.shop` on purpose: the frozen shop-mixed registration digests `trace_cli/envs/shop/`
(benchmarks/se/freeze.py), and nothing here changes a draw of the shop's tasks (tests/envs/test_task_digests.py).
The tasks are described in `tasks`; registered as `shop-ladder` (params: `mix` target|base, `withhold`,
`max_turns`, `n_orders`, `tool_set`).

`withhold` (a share, default: none) makes `demonstration(deficits)` withhold each named capability on its own,
with that probability, by a coin drawn from the seed and the capability alone: the skills of one demonstration
are withheld independently, so an agent trained on them cannot infer one skill's behaviour from another's earlier
in the conversation (with one draw per demonstration, as `trace train --deficit-rate` makes, a k-skill task's
skills would be right or wrong together, and k would not compound). The planted base uses `withhold=0.7` with
`deficit_rate: 1.0`.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.ladder.tasks import (
    FAMILIES,
    MIXES,
    PLANTED,
    PLANTED_ON_MIXED,
    SKILLS,
    LadderTask,
    build_task,
)
from trace_cli.envs.shop import ShopEnv, make_shop_env
from trace_cli.envs.shop.tasks import CAPABILITIES
from trace_cli.envs.worlds.facts import clone
from trace_cli.errors import UsageError

__all__ = ["FAMILIES", "PLANTED", "SKILLS", "ShopLadderEnv", "make_shop_ladder_env"]


class ShopLadderEnv(ShopEnv):
    """`shop-ladder`: one conversation of 1-2 requests, one per planted skill, all of which must be right.

    Every tool is offered (`tool_set="all"`) and the user states one request at a time, as in shop-mixed.
    `mix="base"`: the planted base agent's demonstration distribution (even seeds are shop-mixed's tasks)."""

    name = "shop-ladder"

    def __init__(
        self,
        max_turns: int = 16,
        n_orders: int = 5,
        tool_set: str = "all",
        mix: str = "target",
        withhold: float | None = None,
    ):
        super().__init__(max_turns=max_turns, n_orders=n_orders, tool_set=tool_set)
        if mix not in MIXES:
            raise UsageError(f"shop-ladder: parameter 'mix' must be one of {', '.join(MIXES)}, got {mix!r}")
        if withhold is not None and (isinstance(withhold, bool) or not 0.0 <= float(withhold) <= 1.0):
            raise UsageError(
                f"shop-ladder: parameter 'withhold' must be a share from 0 to 1, got {withhold!r}"
            )
        self.mix = mix
        self.withhold = None if withhold is None else float(withhold)

    def family_for_seed(self, seed: int) -> str:
        return "ladder"  # drawn with the task (the seed alone decides it)

    def _build(self, seed: int) -> Any:
        return build_task(seed, self.n_orders, self.mix)

    @property
    def task_id(self) -> str:
        task = self._started()
        prefix = "shop-ladder" if isinstance(task, LadderTask) else "shop-mixed"
        return f"{prefix}-{task.family}-{self._seed}"

    def task_metadata(self) -> dict[str, Any]:
        task = self._started()
        extra: dict[str, Any] = {"required_capabilities": list(task.capabilities)}
        if isinstance(task, LadderTask):
            extra.update(k=len(task.skills), skills=list(task.skills))
        return self._metadata(task.family, **extra)

    def demonstration(self, deficits: set[str] | list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The reference with the named capabilities withheld: on a ladder task every named one at once (a
        task needing two withheld skills does both the withheld way); on a shop-mixed task (mix "base") only the
        planted ones the shop-mixed half withholds (`PLANTED_ON_MIXED`), as `ShopEnv.demonstration` does."""
        unknown = sorted(set(deficits) - set(CAPABILITIES))
        if unknown:
            raise UsageError(f"unknown deficit {unknown[0]!r}; known: {', '.join(CAPABILITIES)}")
        task = self._started()
        if self.withhold is not None:  # each capability on its own coin (the class docstring)
            deficits = {c for c in deficits if self.coin(c) < self.withhold}
        if isinstance(task, LadderTask):
            return clone(task.withholding(set(deficits)))
        return super().demonstration(set(deficits) & set(PLANTED_ON_MIXED))

    def coin(self, capability: str) -> float:
        """The current seed's draw for withholding `capability` (the same whatever else is withheld)."""
        self._started()
        return random.Random(f"shop-ladder-withhold:{self._seed}:{capability}").random()


_PARAMS = ("max_turns", "n_orders", "tool_set", "mix", "withhold")


def make_shop_ladder_env(**params: Any) -> ShopLadderEnv:
    """Factory registered as `shop-ladder`. Params: mix (target|base), withhold, max_turns, n_orders, tool_set."""
    unknown = [k for k in params if k not in _PARAMS]
    if unknown:
        raise UsageError(f"shop-ladder: unknown parameter '{unknown[0]}'; known: {', '.join(_PARAMS)}")
    mix = params.pop("mix", "target")
    withhold = params.pop("withhold", None)
    if isinstance(withhold, str):
        try:
            withhold = float(withhold)
        except ValueError:
            raise UsageError(
                f"shop-ladder: parameter 'withhold' must be a share from 0 to 1, got {withhold!r}"
            ) from None
    env = make_shop_env(**params)  # the shop's own checks of max_turns, n_orders, tool_set
    kw = {k: getattr(env, k) for k in ("max_turns", "n_orders", "tool_set") if k in params}
    return ShopLadderEnv(mix=mix, withhold=withhold, **kw)


PROBE_SEEDS = range(8)  # both k, both mixes' halves, every family


def identity(params: dict[str, Any]) -> dict[str, str]:
    """`factory.identity(params)`: a digest of what the ladder's tasks are (the first observation, the reference
    and each planted skill's withheld demonstration on PROBE_SEEDS), part of every artifact id made from it: when
    the tasks change (restart 1 dropped a skill), an SFT on them is another artifact, never "up to date"."""
    import hashlib
    import json

    env = make_shop_ladder_env(**dict(params))
    h = hashlib.sha256()
    for seed in PROBE_SEEDS:
        obs = env.reset(seed)
        demos = []
        for cap in PLANTED:
            env.reset(seed)
            demos.append(env.demonstration({cap}))
        doc = [obs.system_prompt, obs.messages, env.reference_actions(), demos, env.task_metadata()]
        h.update(json.dumps(doc, sort_keys=True, default=str).encode())
    return {"tasks": h.hexdigest()[:16]}


make_shop_ladder_env.identity = identity
