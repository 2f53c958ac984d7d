"""Hint injection (TRACE's release code): some rollouts of a group see an `<expert_guidance>` block.

For `hinted(share, rollouts)` of a group's rollouts the system prompt ends with a short hint of how to solve
that very task, written from the task's own reference solution (`guidance`): the tool calls in order, with
their arguments, then what to tell the user. The policy is more likely to succeed with it, so a level that the
policy cannot yet solve alone still yields groups whose rewards vary. The gradient step must see the original
prompt: `strip_guidance` removes the block again, and the episode keeps both prompts (`Observation.info`
holds the original system prompt under `"prompt_without_guidance"`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

OPEN, CLOSE = "<expert_guidance>", "</expert_guidance>"
_BLOCK = re.compile(r"\n*" + re.escape(OPEN) + r".*?" + re.escape(CLOSE) + r"\n*", re.S)
MAX_MESSAGE = 160  # characters of a closing message quoted in a hint


def hinted(share: float, rollouts: int) -> int:
    """How many of a group's `rollouts` get the hint: round(share * rollouts), at least 1 when share > 0 and
    at most rollouts - 1 (a group is never all hinted: the unhinted rollouts are the policy on its own)."""
    if share <= 0 or rollouts < 2:
        return 0
    return min(rollouts - 1, max(1, round(share * rollouts)))


def _step(action: dict[str, Any]) -> str:
    if "name" in action:
        args = ", ".join(f"{k}={json.dumps(v)}" for k, v in (action.get("arguments") or {}).items())
        return f"call {action['name']}({args})"
    text = str(action.get("content", ""))
    text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
    return f"tell the user: {text}"


def guidance(reference: list[dict[str, Any]]) -> str:
    """The hint of a task, from its reference actions (the steps that solve it, in order)."""
    steps = "\n".join(f"{i}. {_step(a)}" for i, a in enumerate(reference, 1))
    return f"{OPEN}\nA correct way to handle this request:\n{steps}\n{CLOSE}"


def with_guidance(system_prompt: str, hint: str) -> str:
    return f"{system_prompt}\n\n{hint}"


def strip_guidance(text: str) -> str:
    """`text` without its `<expert_guidance>` block (the prompt the gradient step sees)."""
    return _BLOCK.sub("", text) if OPEN in text else text


class HintedEnv:
    """An environment whose observations carry the task's hint in the system prompt; everything else is the
    wrapped environment's (its reward, its tools, its user)."""

    def __init__(self, env: Any):
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, seed: int) -> Any:
        obs = self._env.reset(seed)
        hint = guidance(self._env.reference_actions())
        info = {**obs.info, "prompt_without_guidance": obs.system_prompt, "hinted": True}
        return dataclasses.replace(obs, system_prompt=with_guidance(obs.system_prompt, hint), info=info)
