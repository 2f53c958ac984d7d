"""Generated tasks are pinned: a (family, seed) of the shop and a (template, level, seed) of the synthetic
environments always give the same task, byte for byte.

Committed models (examples/demo-base-agent) and experiments were trained on these tasks, so a change to the
generators must keep every random draw in its place; these digests change only when a task does (then say so
in the commit, and expect to retrain)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Iterable
from typing import Any

from trace_cli.envs.shop.tasks import FAMILIES
from trace_cli.envs.synthetic import TEMPLATES

SHOP_DIGEST = "7ecf49128474f94ebcd3e15d7c373a8f3f1dd41aca89026fd94f514e0d0d83e1"
SYNTHETIC_DIGEST = "e965d6ab5a5738e00786dfab747db90eced6c481b56ab86f00db4df4c280442c"


def _digest(items: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for x in items:
        h.update(json.dumps(x, sort_keys=True, default=str).encode())
    return h.hexdigest()


def test_shop_tasks_are_pinned():
    def tasks():
        for family, build in FAMILIES.items():
            for n_orders in (4, 5, 10):
                for seed in range(40):
                    rng = random.Random(f"shop:{family}:{seed}")
                    # the next draw too: a helper that draws once more (or less) changes later tasks' streams
                    yield dataclasses.asdict(build(rng, n_orders)), rng.random()

    assert _digest(tasks()) == SHOP_DIGEST


def test_synthetic_tasks_are_pinned():
    def scenarios():
        for cls in TEMPLATES.values():
            for level in range(len(cls.LEVELS)):
                env = cls(level=level)
                for seed in range(8):
                    obs = env.reset(seed)
                    yield dataclasses.asdict(obs), env.task_metadata(), dataclasses.asdict(env._scenario)

    assert _digest(scenarios()) == SYNTHETIC_DIGEST


# Episodes, not only tasks: the observations, rewards and verdicts of fixed action sequences (the reference, the
# reference cut short, a fuzzer's actions) on the synthetic templates (200 tasks each, at their default level)
# and on the shop benchmark (`shop` and `shop-mixed`, seeds 0-99). Pinned before the world seam went in under
# the templates: the shop world behind the seam must give the same episodes, step for step.
EPISODES_DIGEST = "79731254ada2a2b7fa96d5f455695167483d50812ae7425f4479c0c5e383674b"


def _episode(env: Any, seed: int, actions: list[dict[str, Any]]) -> Any:
    from trace_cli.envs.scripted import replay

    ep = replay(env, seed, actions)
    return [dataclasses.asdict(r) for r in ep.results], dataclasses.asdict(ep.verdict)


def _episodes() -> Iterable[Any]:
    from trace_cli.envs.scripted import ActionFuzzer
    from trace_cli.envs.shop import ShopEnv, ShopMixedEnv

    for cls in TEMPLATES.values():
        env = cls()
        for seed in range(200):
            obs = env.reset(seed)
            yield dataclasses.asdict(obs), env.task_metadata(), dataclasses.asdict(env._scenario)
            ref = env.reference_actions()
            yield _episode(env, seed, ref)
            yield _episode(env, seed, ref[: max(1, len(ref) // 2)] + [{"content": "Anything else?"}])
            if seed % 10 == 0:
                fuzz = ActionFuzzer(seed)
                obs = env.reset(seed)
                yield _episode(env, seed, [fuzz.action(obs) for _ in range(10)])
    for env in (ShopEnv(), ShopMixedEnv()):
        for seed in range(100):
            obs = env.reset(seed)
            yield dataclasses.asdict(obs), env.task_metadata()
            yield _episode(env, seed, env.reference_actions())


def test_episodes_are_pinned():
    assert _digest(_episodes()) == EPISODES_DIGEST
