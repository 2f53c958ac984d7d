"""agents.scripted: the built-in policies (`policy:reference`, `policy:demonstration`, `policy:random`)."""

from __future__ import annotations

from trace_cli.agents.scripted import DemonstrationPolicy, RandomPolicy, ReferencePolicy
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout

JOBS = [(s, 0) for s in range(40)]


def _run(policy, jobs=JOBS, make=lambda: make_env("shop")):
    return rollout(policy, make, jobs, max_turns=12, batch_size=8)


def test_reference_policy_solves_every_task():
    assert all(ep.success and ep.reward == 1.0 for ep in _run(ReferencePolicy()))


def test_random_policy_almost_never_succeeds_and_acts():
    eps = _run(RandomPolicy(0))
    assert sum(ep.success for ep in eps) / len(eps) <= 0.05
    assert sum(ep.n_actions for ep in eps) > len(eps)


def test_random_policy_is_reproducible_per_episode_and_reusable():
    """Each episode's draws depend on (policy seed, episode seed, trial) only: the same episode in another
    batch, or on a reused environment, is the same conversation."""
    env = make_env("shop")
    one = rollout(RandomPolicy(9), lambda: env, [(3, 0)], max_turns=12)[0]
    again = rollout(RandomPolicy(9), lambda: env, [(3, 0)], max_turns=12)[0]
    batched = {(e.seed, e.trial): e for e in _run(RandomPolicy(9), [(5, 0), (3, 0), (3, 1)])}
    assert one.messages == again.messages == batched[(3, 0)].messages
    assert (one.reward, one.success, one.breakdown) == (again.reward, again.success, again.breakdown)
    assert batched[(3, 1)].messages != one.messages  # another trial draws anew
    other = rollout(RandomPolicy(10), lambda: env, [(3, 0)], max_turns=12)[0]
    assert other.messages != one.messages


def test_demonstration_withholds_the_named_behaviour():
    withheld = _run(DemonstrationPolicy({"precondition_verification"}, rate=1.0, seed=0))
    needed = [ep for ep in withheld if "precondition_verification" in ep.metadata["required_capabilities"]]
    assert needed and sum(ep.success for ep in needed) / len(needed) <= 0.5
    assert all(ep.success for ep in withheld if ep not in needed)
    assert all(
        ep.success for ep in _run(DemonstrationPolicy({"precondition_verification"}, rate=0.0, seed=0))
    )
