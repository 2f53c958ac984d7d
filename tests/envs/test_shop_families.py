"""Per-family guarantees: the reference always succeeds, random play never does, deficits fail where they should."""

from __future__ import annotations

import pytest

from trace_cli.envs.registry import make_env
from trace_cli.envs.scripted import ActionFuzzer, replay
from trace_cli.envs.shop import CAPABILITIES, FAMILIES, family_capabilities

N_REFERENCE = 500
N_DEFICIT = 300


@pytest.mark.parametrize("family", list(FAMILIES))
def test_reference_solver_reaches_reward_one(family):
    env = make_env("shop", families=[family])
    for seed in range(N_REFERENCE):
        env.reset(seed)
        assert env.task_metadata()["family"] == family
        episode = replay(env, seed, env.reference_actions())
        verdict = episode.verdict
        assert verdict.reward == 1.0 and verdict.success, (seed, verdict.details)
        assert episode.results[-1].done  # the reference ends the conversation cleanly
        assert not any(r.error for r in episode.results), seed
        assert len(episode.actions) <= env.max_turns


def test_random_policy_almost_never_succeeds():
    env = make_env("shop")
    wins = 0
    for seed in range(200):
        fuzz, obs = ActionFuzzer(seed), env.reset(seed)
        wins += replay(env, seed, [fuzz.action(obs) for _ in range(env.max_turns)]).verdict.success
    assert wins / 200 <= 0.02


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_deficit_demonstrations_fail_only_where_the_capability_is_needed(capability):
    needs = family_capabilities()
    assert any(capability in caps for caps in needs.values())
    for family, caps in needs.items():
        env = make_env("shop", families=[family])
        successes = 0
        for seed in range(N_DEFICIT):
            env.reset(seed)
            demo = env.demonstration({capability})
            if capability not in caps:
                assert demo == env.reference_actions()
            successes += replay(env, seed, demo).verdict.success
        rate = successes / N_DEFICIT
        if capability in caps:
            assert rate <= 0.25, (family, rate)
        else:
            assert rate == 1.0, (family, rate)


def test_cancel_order_split_is_about_80_20():
    env = make_env("shop?families=cancel_order")
    forbidden = 0
    for seed in range(N_DEFICIT):
        env.reset(seed)
        forbidden += env.task_metadata()["variant"] == "forbidden"
    assert 0.72 <= forbidden / N_DEFICIT <= 0.88


def test_every_family_variant_occurs():
    env = make_env("shop")
    seen: dict[str, set[str]] = {}
    for seed in range(600):
        env.reset(seed)
        meta = env.task_metadata()
        seen.setdefault(meta["family"], set()).add(meta["variant"])
    assert set(seen) == set(FAMILIES)
    assert seen["return_item"] == {"most_recent", "most_expensive", "by_option"}
    assert seen["cancel_order"] == {"allowed", "forbidden"}
    assert {"2_ops", "3_ops", "4_ops", "5_ops"} <= seen["multi_op"]
    assert len(seen["address_update"]) == 5 and len(seen["exchange"]) == 4
