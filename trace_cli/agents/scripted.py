"""Policies without a model, addressed as built-in model references: `policy:reference` (the environment's
solver), `policy:demonstration?deficits=a,b&rate=0.9` (the solver with named behaviours withheld) and
`policy:random` (random tool calls with schema-typed arguments, and random short messages)."""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.rollout import EpisodeState, Turn


def _episode_rng(seed: int, state: EpisodeState) -> random.Random:
    """One generator per (policy seed, episode seed, trial): an episode's draws do not depend on the others
    in flight."""
    return random.Random(seed * 1_000_003 + state.seed * 31 + state.trial)


class ReferencePolicy:
    """Replays each episode's reference solution (reward 1 by construction; a check on the env)."""

    name = "policy:reference"

    def begin(self, state: EpisodeState) -> None:
        state.turns.append({"plan": list(state.env.reference_actions())})

    def act(self, states: list[EpisodeState]) -> list[Turn]:
        out = []
        for s in states:
            plan = s.turns[0]["plan"]
            out.append(Turn([plan.pop(0)] if plan else [{"content": "Goodbye."}]))
        return out


class DemonstrationPolicy(ReferencePolicy):
    """Replays the environment's deficit demonstrations: `policy:demonstration?deficits=a,b&rate=0.9`.

    This is the behaviour an SFT base agent with those deficits is trained to imitate, scripted: a
    reference point for diagnose (what a base agent "with known failures" produces) that needs no training.
    With rate < 1 a seeded share of episodes shows the withheld behaviour after all."""

    def __init__(self, deficits: set[str], rate: float, seed: int):
        self.deficits = set(deficits)
        self.rate = rate
        self.seed = seed
        self.name = f"policy:demonstration?deficits={','.join(sorted(deficits))}&rate={rate:g}"

    def begin(self, state: EpisodeState) -> None:
        rng = _episode_rng(self.seed, state)
        demo = getattr(state.env, "demonstration", None)
        plan = list(state.env.reference_actions())
        if rng.random() < self.rate:
            if self.deficits and demo is not None:
                plan = list(demo(set(self.deficits)))
            elif demo is None:
                # an environment without named deficits (e.g. a synthesized one): stop half-way and close,
                # the generic way of "not finishing the job" (partial credit where the env grades it)
                plan = plan[: max(1, len(plan) // 2)] + [
                    {"content": "Is there anything else I can help with?"}
                ]
        state.turns.append({"plan": plan})


def _random_value(schema: dict[str, Any], rng: random.Random) -> Any:
    t = schema.get("type", "string")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if t == "integer":
        return rng.randint(0, 100)
    if t == "number":
        return round(rng.uniform(0, 500), 2)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [_random_value(schema.get("items", {}), rng) for _ in range(rng.randint(1, 2))]
    return rng.choice(["#W1000001", "abc", "user_1", "12345", "credit_card_1", "yes"])


_MESSAGES = ["Done.", "Can you tell me more?", "I cannot help with that.", "Sure."]


class RandomPolicy:
    """Random tool calls with schema-typed random arguments, and random short messages: a floor for any
    environment (an agent that does not read the conversation)."""

    name = "policy:random"

    def __init__(self, seed: int):
        self.seed = seed

    def begin(self, state: EpisodeState) -> None:
        state.turns.append({"rng": _episode_rng(self.seed, state)})

    def act(self, states: list[EpisodeState]) -> list[Turn]:
        out = []
        for s in states:
            rng: random.Random = s.turns[0]["rng"]
            if rng.random() < 0.75 and s.tools:
                fn = rng.choice(s.tools)["function"]
                props = fn.get("parameters", {}).get("properties", {})
                args = {k: _random_value(v, rng) for k, v in props.items()}
                out.append(Turn([{"name": fn["name"], "arguments": args}]))
            else:
                out.append(Turn([{"content": rng.choice(_MESSAGES)}]))
        return out
