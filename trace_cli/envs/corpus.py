"""Replayed episodes of registered environments ({messages, tools}) that the model layer needs and may not build
itself (trace_cli.models knows no environment): a preset tokenizer's corpus, pretraining's text, the template check
of an imported model. The stages `model` and `pretrain` hand them down."""

from __future__ import annotations

import random
from typing import Any

from trace_cli.errors import UsageError


def check_envs(names: list[str]) -> None:
    """`envs:` must name registered environments (model and pretrain render their transcripts)."""
    from trace_cli.envs.registry import list_envs

    known = list_envs()
    bad = [e for e in names if e not in known]
    if bad:
        raise UsageError(f"envs: unknown environment(s) {', '.join(bad)}; registered: {', '.join(known)}")


def _replayed(name: str, seed: int, plan: list[dict[str, Any]]) -> dict[str, Any]:
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import replay

    ep = replay(make_env(name), seed, plan)
    return {"messages": ep.messages, "tools": ep.tools}


def corpus_episodes(env_names: list[str], n_seeds: int, seed: int) -> list[dict[str, Any]]:
    """Reference solutions and deficit demonstrations ({messages, tools}) on `n_seeds` seeded draws per
    environment: the text a preset's tokenizer is trained on and pretraining copies from."""
    from trace_cli.envs.registry import make_env

    rng = random.Random(seed)
    out = []
    for name in env_names:
        env = make_env(name)
        for _ in range(n_seeds):
            sd = rng.randrange(1 << 30)
            env.reset(sd)
            plans = [env.reference_actions()]
            demo = getattr(env, "demonstration", None)
            caps = (env.task_metadata() or {}).get("required_capabilities") or []
            if demo is not None and caps:
                plans.append(demo({rng.choice(caps)}))
            out += [_replayed(name, sd, plan) for plan in plans]
    return out


def sample_episodes(env_names: list[str], seeds: int = 3) -> list[dict[str, Any]]:
    """A few replayed reference episodes ({messages, tools}, seeds 0..seeds-1) to check a template against."""
    from trace_cli.envs.registry import make_env

    out = []
    for name in env_names:
        for s in range(seeds):
            env = make_env(name)
            env.reset(s)
            out.append(_replayed(name, s, env.reference_actions()))
    return out
