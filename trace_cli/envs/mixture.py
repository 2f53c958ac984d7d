"""`mixture`: several environments' tasks in equal shares, as one environment — what one adapter trained on the
union of TRACE's environments sees (issue 44's mixed-environment baseline: it separates "the environments help"
from "composing experts helps").

    {"name": "mixture", "params": {"envs": ["store://environment/A", "store://environment/B"]}}
    mixture?envs=store://environment/A,store://environment/B

Seed s is member s % n's task at seed s // n (so consecutive seeds take turns, and a synthesized member's train
range 0:100000 is reached by the mixture's seeds 0:100000 x n). Everything of an episode is its member's: the
observation, tools, user, reward and reference actions. A GRPO group hints its member's share of episodes
(`hint_share_of`): each calibrated environment keeps the hint share its calibration ended with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trace_cli.errors import UsageError

NAME = "mixture"


def members_of(params: dict[str, Any]) -> list[Any]:
    """The member references of a mixture's parameters (at least two)."""
    envs = params.get("envs")
    extra = sorted(set(params) - {"envs"})
    if extra:
        raise UsageError(f"environment {NAME!r} has no parameter {extra[0]!r}; known parameters: envs")
    if isinstance(envs, str):
        envs = [envs]
    if not isinstance(envs, list) or len(envs) < 2:
        raise UsageError(f"environment {NAME!r}: envs must list at least two environments, got {envs!r}")
    if any(isinstance(e, dict) and e.get("name") == NAME for e in envs) or any(
        isinstance(e, str) and e.split("?")[0] == NAME for e in envs
    ):
        raise UsageError(f"environment {NAME!r}: a mixture of mixtures; list their members instead")
    return list(envs)


class MixtureEnv:
    """The members' tasks in equal shares (seed s: member s % n at seed s // n)."""

    def __init__(self, members: Sequence[Any]):
        self.members = list(members)
        self._current = self.members[0]

    def member(self, seed: int) -> tuple[Any, int]:
        n = len(self.members)
        return self.members[seed % n], seed // n

    def reset(self, seed: int) -> Any:
        env, own = self.member(seed)
        self._current = env
        return env.reset(own)

    def step(self, action: dict[str, Any]) -> Any:
        return self._current.step(action)

    def verify(self) -> Any:
        return self._current.verify()

    def task_metadata(self) -> dict[str, Any]:
        return self._current.task_metadata()

    def reference_actions(self) -> list[dict[str, Any]]:
        return self._current.reference_actions()

    def hint_share_of(self, seed: int) -> float:
        """The hint share of the member that plays `seed` (its calibration's; 0 for a target)."""
        return float(getattr(self.member(seed)[0], "hint_share", 0.0) or 0.0)

    def __getattr__(self, name: str) -> Any:  # whatever else the episode's member offers (own budget, ...)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._current, name)
