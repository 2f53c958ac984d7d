"""Driving an Environment step by step without an agent: `replay` an action list (an `Episode`: every
StepResult and the verdict), and `ActionFuzzer`, random and often invalid actions that exercise an
environment's error paths.

The environment checks (envs.synthetic.checks) and the environment tests use these in pure Python. They are no
agent: agents (trace_cli.agents, e.g. `policy:random`) answer conversations through the rollout loop.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from trace_cli.envs.base import Environment, Observation, RewardBreakdown, StepResult

_WORDS = [
    "hello",
    "sure",
    "okay",
    "order",
    "item",
    "thanks",
    "sorry",
    "please",
    "wait",
    "account",
    "the",
    "help",
    "done",
    "maybe",
    "check",
    "request",
    "yes",
    "no",
]


class ActionFuzzer:
    """Random actions for an observation: a random tool with random, often wrong, arguments, or a random
    message.

    Arguments are drawn per schema type, but with some probability a property is dropped, given the wrong
    type, or an unknown property is added, so they also exercise the environment's error paths.
    """

    def __init__(self, seed: int, p_message: float = 0.25):
        self.rng = random.Random(seed)
        self.p_message = p_message

    def _string(self) -> str:
        r = self.rng.random()
        if r < 0.3:
            return f"#W{self.rng.randint(0, 9_999_999):07d}"
        if r < 0.5:
            return str(self.rng.randint(0, 10**10))
        if r < 0.7:
            return self.rng.choice(["credit_card_", "paypal_", "gift_card_", "user_"]) + str(
                self.rng.randint(0, 10**7)
            )
        return "".join(
            self.rng.choice(string.ascii_letters + " _#@.") for _ in range(self.rng.randint(0, 12))
        )

    def _value(self, schema: dict[str, Any]) -> Any:
        if "enum" in schema and self.rng.random() < 0.7:
            return self.rng.choice(schema["enum"])
        kind = schema.get("type", "string")
        if self.rng.random() < 0.1:  # the wrong type on purpose
            kind = self.rng.choice(["string", "integer", "array", "object", "boolean"])
        if kind == "integer":
            return self.rng.randint(-5, 10**6)
        if kind == "number":
            return round(self.rng.uniform(-10, 1000), 2)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "array":
            return [self._value(schema.get("items", {})) for _ in range(self.rng.randint(0, 3))]
        if kind == "object":
            return {}
        return self._string()

    def message(self) -> dict[str, Any]:
        return {"content": " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(1, 8)))}

    def action(self, observation: Observation) -> dict[str, Any]:
        if not observation.tools or self.rng.random() < self.p_message:
            return self.message()
        fn = self.rng.choice(observation.tools)["function"]
        props = fn.get("parameters", {}).get("properties", {})
        args = {k: self._value(v) for k, v in props.items() if self.rng.random() < 0.9}
        if self.rng.random() < 0.1:
            args["unexpected"] = self._string()
        return {"name": fn["name"], "arguments": args}


@dataclass
class Episode:
    """What one scripted run produced."""

    actions: list[dict[str, Any]]
    results: list[StepResult]
    verdict: RewardBreakdown
    task_id: str


def replay(env: Environment, seed: int, actions: list[dict[str, Any]]) -> Episode:
    """Reset to `seed` and play `actions` in order until the episode ends (extra actions are dropped)."""
    obs = env.reset(seed)
    done_actions, results = [], []
    for action in actions:
        result = env.step(action)
        done_actions.append(action)
        results.append(result)
        if result.done:
            break
    return Episode(done_actions, results, env.verify(), obs.task_id)
