"""`shop-ladder` (issue 44): every task is solved by its reference; a demonstration that withholds one planted skill
fails every family that needs it and no other; families come in equal shares over consecutive seeds; the rules
analyst sees each withheld skill as its capability LACKING; the base mix is shop-mixed's own tasks on even seeds;
the tasks are pinned by digest (the planted base agent is trained on them)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter

import pytest

from trace_cli.analysts.rules import needs
from trace_cli.envs.ladder import FAMILIES, PLANTED, SKILLS
from trace_cli.envs.ladder.tasks import BY_K, skills_for_seed
from trace_cli.envs.registry import list_envs, make_env
from trace_cli.envs.rollout import replay
from trace_cli.envs.shop.tasks.mixed import build_task as mixed_task
from trace_cli.errors import UsageError

SEEDS = range(0, 40)  # 10 rounds of 4: every family several times
# seeds 0-35: the first observation and metadata in each mix; the episodes of the reference and of each withheld
# skill (messages, reward, breakdown). Same under any PYTHONHASHSEED (checked when they were pinned).
TASKS_DIGEST = "73c95f61879e710cdb1e854b936fd9a20b2180503a7909d54cd7083ad30208ba"
EPISODES_DIGEST = "9de5d03fcf504156acd059cff95d98191c48e09fc14aa25f7cb322c516c96cde"


def _play(seed: int, actions, mix: str = "target"):
    return replay(make_env(f"shop-ladder?mix={mix}"), seed, actions)


def test_the_reference_solves_every_task():
    env = make_env("shop-ladder")
    for seed in SEEDS:
        env.reset(seed)
        ep = _play(seed, env.reference_actions())
        assert ep.reward == 1.0, (seed, env.task_metadata()["family"])


def test_withholding_a_planted_skill_fails_every_family_that_needs_it_and_no_other():
    env = make_env("shop-ladder")
    outcomes: Counter = Counter()
    for seed in SEEDS:
        env.reset(seed)
        meta = env.task_metadata()
        assert meta["required_capabilities"] == [SKILLS[s] for s in meta["skills"]]
        for cap in PLANTED:
            env.reset(seed)
            ep = _play(seed, env.demonstration({cap}))
            needed = cap in meta["required_capabilities"]
            outcomes[(needed, ep.reward)] += 1
            assert ep.reward == (0.0 if needed else 1.0), (seed, meta["family"], cap)
        env.reset(seed)
        assert _play(seed, env.demonstration(set(PLANTED))).reward == 0.0
    assert outcomes[(True, 0.0)] > 0 and outcomes[(False, 1.0)] > 0
    with pytest.raises(UsageError, match="unknown deficit"):
        env.demonstration({"patience"})


def test_families_come_in_equal_shares_over_consecutive_seeds():
    assert len(FAMILIES) == 3 and sorted(len(v) for v in BY_K.values()) == [1, 2]
    env = make_env("shop-ladder")
    for start in (0, 1, 5, 700001):
        ks = Counter()
        for seed in range(start, start + 2):
            env.reset(seed)
            ks[env.task_metadata()["k"]] += 1
        assert ks == Counter({1: 1, 2: 1}), start
    for start in (0, 4, 700002 - 700002 % 4):
        fams = Counter()
        for seed in range(start, start + 4):
            env.reset(seed)
            meta = env.task_metadata()
            assert meta["family"] == "ladder-" + "+".join(skills_for_seed(seed)) and meta["k"] == len(
                meta["skills"]
            )
            fams[meta["family"]] += 1
        assert fams == Counter({f: 2 if "+" in f else 1 for f in FAMILIES}), start
    env.reset(3)
    assert env.task_id == f"shop-ladder-{env.task_metadata()['family']}-3"


def _labels(seed: int, actions, reference) -> dict[str, str]:
    """The rules analyst's labels of the planted capabilities on the episode of `actions`."""
    ep = _play(seed, actions)
    episode = {
        "episode_id": "e",
        "task_id": ep.task_id,
        "success": ep.success,
        "reward": ep.reward,
        "messages": ep.messages,
        "reference_actions": reference,
    }
    return needs(episode, list(PLANTED))


def test_the_rules_analyst_sees_each_withheld_skill_as_its_capability_lacking():
    """What lets the diagnosis find the planted set: on the withheld way of a skill its capability is LACKING,
    on the reference it is never LACKING."""
    env = make_env("shop-ladder")
    for seed in range(0, 27):
        env.reset(seed)
        meta = env.task_metadata()
        ref = env.reference_actions()

        assert "LACKING" not in _labels(seed, ref, ref).values(), seed
        for cap in meta["required_capabilities"]:
            env.reset(seed)
            assert _labels(seed, env.demonstration({cap}), ref)[cap] == "LACKING", (seed, meta["family"], cap)


def test_the_base_mix_is_shop_mixed_on_even_seeds_with_only_the_planted_deficits_withheld():
    env = make_env("shop-ladder?mix=base")
    mixed = make_env("shop-mixed")
    kinds = Counter()
    for seed in range(0, 40):
        env.reset(seed)
        if seed % 2:
            assert env.task_id.startswith("shop-ladder-ladder-")
            kinds["ladder"] += 1
            continue
        mixed.reset(seed)
        assert env.task_id == mixed.task_id and env.reference_actions() == mixed.reference_actions()
        assert dataclasses.asdict(mixed_task(seed, 5))["reference"] == env.reference_actions()
        caps = env.task_metadata()["required_capabilities"]
        # shop-mixed's "most expensive item", multi-step and address copies are never withheld in the base mix
        for cap in ("structured_data_reasoning", "multi_step_completion", "tool_calling_precision"):
            env.reset(seed)
            assert env.demonstration({cap}) == env.reference_actions()
        cap = "precondition_verification"
        env.reset(seed)
        mixed.reset(seed)
        assert env.demonstration({cap}) == mixed.demonstration({cap})
        kinds[cap] += cap in caps
    assert kinds["ladder"] == 20 and kinds["precondition_verification"] > 0


def test_withhold_draws_each_skill_on_its_own_coin():
    """`withhold=0.7`: each planted skill of a demonstration is withheld with probability 0.7, independently of the
    others and of what else is named (so k skills compound in what the base learns), the same on every call."""
    env = make_env("shop-ladder?mix=base&withhold=0.7")
    withheld, pairs, n = Counter(), Counter(), Counter()
    for seed in range(1, 1200, 2):  # the ladder half of the base mix
        env.reset(seed)
        skills = env.task_metadata()["skills"]
        ref = env.reference_actions()
        off = {}
        for s in skills:
            cap = SKILLS[s]
            env.reset(seed)
            alone = env.demonstration({cap})
            env.reset(seed)
            assert alone == env.demonstration({cap}), seed  # a coin per seed and capability: the same again
            off[s] = alone != ref
            n[s] += 1
            withheld[s] += off[s]
        env.reset(seed)
        both = env.demonstration(set(PLANTED))
        # naming every planted capability withholds exactly the skills whose own coin fell
        assert _play(seed, both, mix="base").reward == (0.0 if any(off.values()) else 1.0), seed
        for a, b in (("refuse", "lookup"),):
            if a in off and b in off:
                pairs[(a, b, "n")] += 1
                pairs[(a, b, "both")] += off[a] and off[b]
    for s in SKILLS:
        assert abs(withheld[s] / n[s] - 0.7) < 0.07, (s, withheld[s], n[s])
    assert abs(pairs[("refuse", "lookup", "both")] / pairs[("refuse", "lookup", "n")] - 0.49) < 0.1
    with pytest.raises(UsageError, match="withhold"):
        make_env("shop-ladder?withhold=1.5")


def test_registered_with_its_parameters_checked():
    assert "shop-ladder" in list_envs()
    env = make_env("shop-ladder?max_turns=12&n_orders=6")
    assert (env.max_turns, env.n_orders, env.tool_set, env.mix) == (12, 6, "all", "target")
    obs = env.reset(0)
    assert len(obs.tools) == len(make_env("shop-mixed").reset(0).tools)
    for bad, msg in (("mix=oops", "mix"), ("families=a", "unknown parameter"), ("n_orders=2", "n_orders")):
        with pytest.raises(UsageError, match=msg):
            make_env(f"shop-ladder?{bad}")


def _digest(items) -> str:
    h = hashlib.sha256()
    for x in items:
        h.update(json.dumps(x, sort_keys=True, default=str).encode())
    return h.hexdigest()


def test_tasks_and_episodes_are_pinned():
    """The planted base agent and the mechanism test are built on these tasks: a change to them changes these
    digests (say so in the commit and retrain the bases)."""

    def tasks():
        for mix in ("target", "base"):
            env = make_env(f"shop-ladder?mix={mix}")
            for seed in range(36):
                obs = env.reset(seed)
                yield mix, seed, dataclasses.asdict(obs), env.task_metadata()

    def episodes():
        env = make_env("shop-ladder")
        for seed in range(36):
            env.reset(seed)
            for deficits in ((), *((c,) for c in PLANTED)):
                env.reset(seed)
                ep = _play(seed, env.demonstration(set(deficits)))
                yield seed, deficits, ep.messages, ep.reward, ep.breakdown

    assert (_digest(tasks()), _digest(episodes())) == (TASKS_DIGEST, EPISODES_DIGEST)


def test_artifact_ids_follow_the_tasks(monkeypatch):
    """The ladder's identity carries a digest of its tasks, so a change to them (restart 1 dropped a skill) makes
    every artifact trained on them another one: `trace run` never calls such an SFT up to date."""
    from trace_cli.envs.ladder import tasks
    from trace_cli.envs.refs import env_identity

    def ident(ref: str) -> dict:
        return env_identity(ref)["id"]

    before = ident("shop-ladder?mix=base&withhold=0.7")
    assert before == ident("shop-ladder?mix=base&withhold=0.7") and before["data"]["tasks"]
    assert before != ident("shop-ladder?mix=base") != ident("shop-ladder")
    real = tasks.op_refuse

    def reworded(rng, order):
        op = real(rng, order)
        return dataclasses.replace(op, text=op.text + ", please")

    monkeypatch.setattr(tasks, "op_refuse", reworded)
    assert ident("shop-ladder?mix=base&withhold=0.7") != before
