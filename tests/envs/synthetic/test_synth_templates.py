"""Capability templates: determinism and reference solver (property-based), do-nothing, leakage, knobs, schemas."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_cli.envs.base import Environment
from trace_cli.envs.scripted import ActionFuzzer, replay
from trace_cli.envs.shop import POLICY, TOOL_SCHEMAS
from trace_cli.envs.synthetic import TEMPLATES, get_template, make_template
from trace_cli.envs.synthetic.checks import check_do_nothing, check_leakage, run_checks
from trace_cli.envs.synthetic.policy_compliance_under_pressure import PRESSURE
from trace_cli.errors import UsageError

NAMES = sorted(TEMPLATES)
PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _trace(env, seed, actions):
    ep = replay(env, seed, actions)
    return (
        [(r.observation, r.role, r.done, r.reward, r.error) for r in ep.results],
        (ep.verdict.reward, ep.verdict.success, ep.verdict.components),
    )


@pytest.mark.parametrize("name", NAMES)
@PROPS
@given(seed=st.integers(0, 10**9), level=st.integers(0, 6))
def test_same_seed_same_episode_and_reward(name, seed, level):
    level %= len(TEMPLATES[name].LEVELS)
    a, b = make_template(name, level=level), make_template(name, level=level)
    oa, ob = a.reset(seed), b.reset(seed)
    assert oa.to_dict() == ob.to_dict()
    assert a.task_metadata() == b.task_metadata()
    noise = ActionFuzzer(seed)
    actions = [noise.action(oa) for _ in range(5)] + a.reference_actions()
    assert _trace(a, seed, actions) == _trace(b, seed, actions) == _trace(a, seed, actions)


@pytest.mark.parametrize("name", NAMES)
@PROPS
@given(seed=st.integers(0, 10**9), level=st.integers(0, 6))
def test_reference_solver_reward_1(name, seed, level):
    env = make_template(name, level=level % len(TEMPLATES[name].LEVELS))
    env.reset(seed)
    v = replay(env, seed, env.reference_actions()).verdict
    assert v.success and v.reward == 1.0, (seed, level, v)


@pytest.mark.parametrize("name", NAMES)
def test_gate_checks_pass_on_every_level(name):
    for level in (0, 2, len(TEMPLATES[name].LEVELS) - 1):
        results = run_checks(
            lambda level=level: make_template(name, level=level),
            reference_seeds=100,
            determinism_seeds=5,
            do_nothing_seeds=60,
            leakage_seeds=150,
        )
        assert all(r.passed for r in results), [r.to_dict() for r in results if not r.passed]


@pytest.mark.parametrize("name", NAMES)
def test_protocol_prompt_style_and_shop_schemas(name):
    env = make_template(name)
    assert isinstance(env, Environment)
    obs = env.reset(3)
    assert obs.system_prompt == POLICY  # the target's policy style, verbatim
    assert len(obs.messages) == 1 and obs.messages[0]["role"] == "user"
    # the target's whole action space (every shop tool), the ones the task needs first, in the template's order
    names = [t["function"]["name"] for t in obs.tools]
    assert names[: len(env.TOOLS)] == list(env.TOOLS) and sorted(names) == sorted(TOOL_SCHEMAS)
    for t in obs.tools:
        assert t == TOOL_SCHEMAS[t["function"]["name"]]  # exactly the shop's schema
    assert set(env.tool_sources.values()) == {"shop"}
    meta = env.task_metadata()
    assert meta["params"] == env.params and set(env.KNOBS) <= set(meta["params"])  # knobs are recorded
    assert meta["answer_values"] and meta["required_capabilities"] == [name]
    assert len(obs.messages[0]["content"]) < 400  # short prompts for a small model


@pytest.mark.parametrize("name", NAMES)
def test_do_nothing_never_succeeds_and_rewards_are_graded(name):
    assert check_do_nothing(
        lambda: make_template(name, level=len(TEMPLATES[name].LEVELS) - 1), range(80)
    ).passed
    # partial credit exists: GRPO groups get variance even without full success
    env = make_template(name, level=3)
    partial = set()
    for seed in range(60):
        env.reset(seed)
        ref = env.reference_actions()
        calls = [a for a in ref if "name" in a]
        tries = [calls[:cut] for cut in range(1, len(calls) + 1)]  # stopping early, or not telling the user
        for a in calls:  # one imprecise argument
            if a["name"] == "modify_user_address":
                tries.append(
                    [
                        c if c is not a else {**a, "arguments": {**a["arguments"], "city": "Nowhere"}}
                        for c in calls
                    ]
                )
        for t in tries:
            v = replay(env, seed, t + [{"content": "Done, goodbye."}]).verdict
            if 0 < v.reward < 1:
                partial.add(round(v.reward, 3))
    assert partial, f"{name}: no partial rewards"


def test_answers_never_in_opening_message():
    for name in NAMES:
        res = check_leakage(
            lambda name=name: make_template(name, level=len(TEMPLATES[name].LEVELS) - 1), range(300)
        )
        assert res.passed, res.message
    env = make_template("structured_data_reasoning", level=5)
    for seed in range(100):
        text = env.reset(seed).messages[0]["content"]
        meta = env.task_metadata()
        ref_write = next(
            a for a in meta["reference_actions"] if a.get("name") == "return_delivered_order_items"
        )
        assert ref_write["arguments"]["item_ids"][0] not in text
    env = make_template("precondition_verification", level=5)
    for seed in range(100):
        text = env.reset(seed).messages[0]["content"].lower()
        assert not any(s in text for s in ("pending", "processed", "delivered")), text


def test_leakage_check_catches_a_leaky_env():
    class Leaky(get_template("tool_calling_precision")):
        def task_metadata(self):
            meta = super().task_metadata()
            meta["answer_values"].append(self._scenario.request.split()[-1].strip("."))
            return meta

    res = check_leakage(lambda: Leaky(level=0), range(20))
    assert not res.passed and "seed" in res.message


def test_knobs_levels_and_validation():
    cls = get_template("precondition_verification")
    assert cls.harder({"level": 2}) == {"level": 3}
    assert cls.easier({"level": 0}) is None and cls.harder({"level": len(cls.LEVELS) - 1}) is None
    assert cls.harder({"level": 1, "n_orders": 7}) == {"level": 2, "n_orders": 7}  # pinned knobs stay
    env = cls(level=4, forbidden_fraction=0.0)
    assert env.params["n_requests"] == cls.LEVELS[4]["n_requests"] and env.params["forbidden_fraction"] == 0.0
    for seed in range(30):  # no forbidden requests => every request is allowed
        env.reset(seed)
        assert all(r["allowed"] for r in env._scenario.data["requests"])
    with pytest.raises(UsageError, match="unknown parameter 'bogus'"):
        cls(bogus=1)
    with pytest.raises(UsageError, match="level"):
        cls(level=len(cls.LEVELS))
    with pytest.raises(UsageError, match="n_requests"):
        cls(n_requests=3, n_orders=2)
    with pytest.raises(UsageError, match="between"):
        cls(forbidden_fraction=1.5)
    with pytest.raises(UsageError, match="unknown value"):
        get_template("structured_data_reasoning")(kinds=["nope"])
    with pytest.raises(UsageError, match="no environment template"):
        get_template("tone_and_empathy")


def test_difficulty_knobs_change_the_tasks():
    msc = get_template("multi_step_completion")
    easy, hard = msc(level=0), msc(level=len(msc.LEVELS) - 1)
    n_easy = [len(easy.reset(s) and easy._scenario.data["targets"]) for s in range(50)]
    n_hard = [len(hard.reset(s) and hard._scenario.data["targets"]) for s in range(50)]
    assert max(n_easy) <= 2 and min(n_hard) >= 4 and 1 in n_easy
    pcp = get_template("policy_compliance_under_pressure")(level=5, adversarial_fraction=1.0)
    for seed in range(20):
        pcp.reset(seed)
        assert pcp.task_metadata()["variant"].endswith("adversarial")
        assert len(pcp._scenario.pressure) == 4


def test_pressure_user_pushes_back_and_giving_in_fails():
    env = get_template("policy_compliance_under_pressure")(
        level=2, adversarial_fraction=1.0, kinds=["cancel"]
    )
    env.reset(11)
    ref = env.reference_actions()
    refusal = ref[-1]["content"]
    reads = [a for a in ref if "name" in a]
    for a in reads:
        env.step(a)
    r = env.step({"content": refusal})
    assert not r.done and r.role == "user" and r.observation in PRESSURE  # pushes back instead of leaving
    oid = env._scenario.data["order_id"]
    env.step({"name": "cancel_pending_order", "arguments": {"order_id": oid, "reason": "no longer needed"}})
    for _ in range(3):
        env.step({"content": refusal})
    v = env.verify()
    assert not v.success and v.details["forbidden_attempt"]


def test_tool_errors_never_raise_and_bad_args_are_reported():
    env = make_template("tool_calling_precision", level=2)
    env.reset(0)
    r = env.step({"name": "modify_user_address", "arguments": {"user_id": 5}})
    assert r.error and "Error" in r.observation
    r = env.step({"name": "nope", "arguments": {}})
    assert r.error and "unknown tool" in r.observation
    r = env.step({"name": "get_order_details", "arguments": "{not json"})
    assert r.error
    r = env.step({"bogus": 1})
    assert r.error


def test_determinism_across_processes_and_hash_seeds():
    """No hidden global state: other interpreters with other PYTHONHASHSEEDs build the same tasks."""
    import os
    import subprocess
    import sys

    code = (
        "import hashlib, json\n"
        "from trace_cli.envs.synthetic import TEMPLATES\n"
        "from trace_cli.envs.scripted import replay\n"
        "h = hashlib.sha256()\n"
        "for name, cls in sorted(TEMPLATES.items()):\n"
        "    env = cls(level=len(cls.LEVELS) - 1)\n"
        "    for seed in range(8):\n"
        "        h.update(json.dumps(env.reset(seed).to_dict(), sort_keys=True).encode())\n"
        "        ep = replay(env, seed, env.reference_actions())\n"
        "        h.update(json.dumps([r.observation for r in ep.results]).encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for hs in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": hs},
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1
