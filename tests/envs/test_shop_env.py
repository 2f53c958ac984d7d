"""The shop environment's mechanics: determinism, error observations, the scripted user, reward, metadata."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from trace_cli.envs.base import Environment
from trace_cli.envs.registry import make_env
from trace_cli.envs.scripted import ActionFuzzer, replay
from trace_cli.envs.shop import CAPABILITIES, FAMILIES, ShopEnv, family_capabilities
from trace_cli.envs.shop.env import fact_communicated
from trace_cli.envs.worlds.user import GOODBYE, ScriptedUser
from trace_cli.errors import UsageError


def _digest(env: ShopEnv, seeds) -> str:
    h = hashlib.sha256()
    for seed in seeds:
        h.update(json.dumps(env.reset(seed).to_dict(), sort_keys=True).encode())
        for result in replay(env, seed, env.reference_actions()).results:
            h.update(f"{result.observation}|{result.reward}|{result.done}".encode())
    return h.hexdigest()


def test_same_seed_same_task_state_and_rewards():
    a, b = make_env("shop"), make_env("shop")
    for seed in range(12):
        assert a.reset(seed).to_dict() == b.reset(seed).to_dict()
        assert a.task_metadata() == b.task_metadata()
        # identical (even wrong) actions give identical observations and rewards
        actions = a.demonstration({"tool_calling_precision", "multi_step_completion"}) + [{"content": "ok"}]
        ra, rb = replay(a, seed, actions), replay(b, seed, actions)
        assert [(r.observation, r.reward, r.done, r.error) for r in ra.results] == [
            (r.observation, r.reward, r.done, r.error) for r in rb.results
        ]
        assert ra.verdict == rb.verdict


def test_determinism_across_processes_and_hash_seeds():
    """No hidden global state: another interpreter with another PYTHONHASHSEED builds the same tasks."""
    here = _digest(make_env("shop"), range(6))
    code = (
        "import sys; sys.path.insert(0, 'tests/envs');"
        "from test_shop_env import _digest; from trace_cli.envs.registry import make_env;"
        "print(_digest(make_env('shop'), range(6)))"
    )
    for hash_seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONHASHSEED=hash_seed),
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )
        assert out.stdout.strip() == here


def test_different_seeds_differ():
    env = make_env("shop")
    firsts = {env.reset(seed).messages[0]["content"] for seed in range(60)}
    assert len(firsts) == 60
    one = make_env("shop?families=cancel_order")
    assert one.reset(1).messages != one.reset(2).messages


def test_reset_restores_the_initial_state():
    env = make_env("shop?families=cancel_order")
    seed = next(s for s in range(100) if (env.reset(s), env.task_metadata()["variant"])[1] == "allowed")
    assert replay(env, seed, env.reference_actions()).verdict.success
    env.reset(seed)
    assert env.verify().components["db"] == 0.0  # the cancellation was undone by reset
    assert replay(env, seed, env.reference_actions()).verdict.success


def test_observation_shape_and_sizes():
    env = make_env("shop")
    assert isinstance(env, Environment)
    lengths = []
    for seed in range(120):
        obs = env.reset(seed)
        assert len(obs.system_prompt) <= 600
        assert obs.messages[0]["role"] == "user"
        assert 4 <= len(obs.tools) <= 8
        for tool in obs.tools:
            assert (
                tool["type"] == "function" and tool["function"]["parameters"]["additionalProperties"] is False
            )
        lengths += [len(r.observation) for r in replay(env, seed, env.reference_actions()).results]
    lengths.sort()
    assert lengths[len(lengths) // 2] <= 400 and lengths[-1] <= 600
    assert len(make_env("shop?tool_set=all").reset(0).tools) == 11


def test_hidden_metadata_never_reaches_the_agent():
    env = make_env("shop")
    hidden = list(CAPABILITIES) + [f for f in FAMILIES if f != "exchange"]  # "exchange" is also a tool word
    for seed in range(60):
        obs = env.reset(seed)
        meta = env.task_metadata()
        assert meta["task_id"] == f"shop-{meta['family']}-{seed}" == obs.task_id
        assert meta["required_capabilities"] == family_capabilities()[meta["family"]]
        assert meta["reference_actions"] == env.reference_actions()
        visible = json.dumps([obs.system_prompt, obs.tools, obs.messages, obs.info])
        results = json.dumps([r.observation for r in replay(env, seed, env.reference_actions()).results])
        for word in hidden:  # whole words: "return_items" (a result field) is not the family "return_item"
            pattern = re.compile(rf"(?<!\w){word}(?!\w)")
            assert not pattern.search(visible) and not pattern.search(results), word


def _env_at(family: str, seed: int = 0, max_turns: int = 40) -> ShopEnv:
    env = make_env("shop", families=[family], max_turns=max_turns)
    env.reset(seed)
    return env


def _error(env: ShopEnv, action) -> str:
    result = env.step(action)
    assert result.error and result.observation.startswith("Error: "), result
    return result.observation


def test_malformed_tool_calls_give_error_observations():
    env = _env_at("exchange")
    auth = env.reference_actions()[0]
    assert "authenticate" in _error(
        env, {"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}
    )
    assert not env.step(auth).error
    assert "unknown tool" in _error(env, {"name": "delete_everything", "arguments": {}})
    assert "unknown tool" in _error(
        env, {"name": "cancel_pending_order", "arguments": {}}
    )  # not exposed here
    assert "unknown tool" in _error(env, {"name": 7, "arguments": {}})
    assert "missing required argument 'order_id'" in _error(
        env, {"name": "get_order_details", "arguments": {}}
    )
    assert "unexpected argument 'x'" in _error(
        env, {"name": "get_order_details", "arguments": {"order_id": "#W1", "x": 1}}
    )
    assert "must be of type string" in _error(
        env, {"name": "get_order_details", "arguments": {"order_id": 1234567}}
    )
    assert "not valid JSON" in _error(env, {"name": "get_order_details", "arguments": "{order_id: "})
    assert "JSON object" in _error(env, {"name": "get_order_details", "arguments": [1]})
    assert "order not found" in _error(
        env, {"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}
    )
    assert "product not found" in _error(
        env, {"name": "get_product_details", "arguments": {"product_id": "1"}}
    )
    assert "must be of type array" in _error(
        env,
        {
            "name": "exchange_delivered_order_items",
            "arguments": {
                "order_id": "#W1",
                "item_ids": "1",
                "new_item_ids": ["2"],
                "payment_method_id": "x",
            },
        },
    )
    assert "tool call" in _error(env, {"foo": 1})
    assert "tool call" in _error(env, "not a dict")
    assert "string" in _error(env, {"content": 5})
    # arguments as an OpenAI-style JSON string work
    order_id = env.reference_actions()[1]["arguments"]["order_id"]
    ok = env.step({"name": "get_order_details", "arguments": json.dumps({"order_id": order_id})})
    assert not ok.error and json.loads(ok.observation)["order_id"] == order_id
    assert env.db == _env_at("exchange").db  # nothing above changed the database


def test_database_enforces_status_rules_and_one_user():
    env = make_env("shop?families=cancel_order&max_turns=40")
    seed = next(s for s in range(100) if (env.reset(s), env.task_metadata()["variant"])[1] == "forbidden")
    env.reset(seed)
    ref = env.reference_actions()
    env.step(ref[0])
    cancel = {
        "name": "cancel_pending_order",
        "arguments": {"order_id": ref[1]["arguments"]["order_id"], "reason": "no longer needed"},
    }
    assert "non-pending" in _error(env, cancel)
    assert "must be one of" in _error(
        env, dict(cancel, arguments=dict(cancel["arguments"], reason="too slow"))
    )
    # another customer's data is off limits, and so is logging in as them
    other = next(u for u in env.db["users"].values() if u["user_id"] != env._task.user_id)
    assert "different user" in _error(
        env, {"name": "get_order_details", "arguments": {"order_id": other["orders"][0]}}
    )
    assert "another user" in _error(
        env, {"name": "find_user_id_by_email", "arguments": {"email": other["email"]}}
    )


def test_return_rules():
    env = _env_at("return_item", 3)
    ref = env.reference_actions()
    write = next(a for a in ref if a.get("name") == "return_delivered_order_items")
    for action in ref:
        if action is not write and "name" in action:
            env.step(action)
    args = write["arguments"]
    user = env.db["users"][env._task.user_id]
    order = env.db["orders"][args["order_id"]]
    foreign = [
        pm
        for pm, m in user["payment_methods"].items()
        if pm != order["payment_method_id"] and m["source"] != "gift_card"
    ]
    if foreign:
        assert "original payment method" in _error(
            env, {"name": write["name"], "arguments": dict(args, payment_method_id=foreign[0])}
        )
    assert "payment method not found" in _error(
        env, {"name": write["name"], "arguments": dict(args, payment_method_id="paypal_0")}
    )
    assert "is not in order" in _error(
        env, {"name": write["name"], "arguments": dict(args, item_ids=["123"])}
    )
    assert not env.step(write).error
    assert "non-delivered" in _error(env, write)  # cannot return twice


def test_episode_ends_on_goodbye_transfer_and_max_turns():
    env = _env_at("order_status")
    end = env.step({"content": "Your order is on its way."})
    assert end.done and end.observation == GOODBYE and end.info["termination"] == "user_stop"
    assert "over" in env.step({"content": "hello?"}).observation

    env = _env_at("order_status")
    r = env.step({"name": "transfer_to_human_agents", "arguments": {"summary": "needs a human"}})
    assert r.done and r.info["termination"] == "transfer" and r.reward == 0.0

    env = make_env("shop?families=order_status&max_turns=3")
    env.reset(0)
    results = [env.step({"content": "Could you repeat that?"}) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True] and results[-1].info[
        "termination"
    ] == "max_turns"


def test_scripted_user_rules():
    user = ScriptedUser("My email is a@b.c.", "Please cancel order #W1.")
    assert user.reply("Could you give me your email address?") == ("My email is a@b.c.", False)
    assert user.reply("Please provide your name and zip code.") == ("My email is a@b.c.", False)
    assert user.reply("Shall I proceed with the cancellation?") == ("Yes, please go ahead.", False)
    assert user.reply("Which color do you prefer?") == ("As I said: Please cancel order #W1.", False)
    assert user.reply("Let me look that up.") == ("Okay.", False)
    assert user.reply("Done. Anything else I can help with?") == (GOODBYE, True)
    assert user.reply("Your order is cancelled.") == (GOODBYE, True)


def test_agent_that_asks_for_confirmation_still_succeeds():
    env = make_env("shop")
    for seed in range(30):
        env.reset(seed)
        actions = []
        for action in env.reference_actions():
            if action.get("name") in (
                "cancel_pending_order",
                "return_delivered_order_items",
                "exchange_delivered_order_items",
                "modify_user_address",
            ):
                actions.append({"content": "I will do this now. Do you confirm (yes/no)?"})
            actions.append(action)
        assert replay(env, seed, actions).verdict.success, seed


def test_reward_components_are_graded():
    env = make_env("shop?families=order_status")
    env.reset(5)
    ref = env.reference_actions()
    facts = env.task_metadata()["required_facts"]
    ep = replay(env, 5, ref[:-1] + [{"content": f"It is {facts[0]}."}])  # status told, total missing
    v = ep.verdict
    assert v.reward == 0.0 and not v.success
    # 2 required facts (1 missing) + 3 forbidden statuses (none said) -> 4 of 5 checks pass
    assert v.components == {"db": 1.0, "db_records": 1.0, "communicate": 0.8}
    assert v.details["missing_facts"] == [facts[1]]
    # naming every possible status does not game the check
    shotgun = ref[:-1] + [{"content": f"It is pending, processed, delivered or cancelled; total {facts[1]}."}]
    v = replay(env, 5, shotgun).verdict
    assert not v.success and len(v.details["wrong_facts"]) == 3 and v.details["missing_facts"] == []


def test_fact_matching_is_lenient_on_numbers_only():
    assert fact_communicated("60.00", ["You get $60 back."])
    assert fact_communicated("1234.50", ["Total: $1,234.5"])
    assert fact_communicated("54.04", ["refunds of 41.64,54.04 dollars"])
    assert not fact_communicated("54.04", ["about 54 dollars"])
    assert fact_communicated("delivered", ["It was Delivered yesterday."])
    assert not fact_communicated("delivered", ["It is undelivered."])


def test_demonstration_api():
    env = make_env("shop")
    env.reset(0)
    assert env.demonstration(set()) == env.reference_actions()
    with pytest.raises(UsageError, match="unknown deficit"):
        env.demonstration({"telepathy"})
    with pytest.raises(UsageError, match="reset"):
        ShopEnv().step({"content": "hi"})


def test_random_actions_are_reproducible_and_the_env_reusable():
    env = make_env("shop")
    obs = env.reset(3)
    a, b = (
        replay(env, 3, [fuzz.action(obs) for _ in range(env.max_turns)])
        for fuzz in (ActionFuzzer(seed=9), ActionFuzzer(seed=9))
    )
    assert a.actions == b.actions and a.verdict == b.verdict
    assert any(r.error for r in a.results) or len(a.actions) < env.max_turns


def test_max_turns_counts_agent_turns_as_the_rollout_loop_does():
    """An assistant turn with several tool calls is one turn of `max_turns` (the loop marks turns with
    begin_turn); without the mark each action is a turn of its own; a new episode starts outside any turn."""
    from trace_cli.envs.rollout import Turn, apply_actions, start

    env = ShopEnv(families=["cancel_order"], max_turns=3)
    st = start(env, 0)
    plan = [a for a in env.reference_actions() if "name" in a]
    calls = [plan[0]] * 3
    apply_actions(st, Turn(calls), max_turns=99)
    assert env.turns == 1 and not st.done  # three calls, one turn
    apply_actions(st, Turn(calls[:2]), max_turns=99)
    assert env.turns == 2 and not st.done
    apply_actions(st, Turn(calls[:1]), max_turns=99)
    assert env.turns == 3 and st.done and st.termination == "max_turns"
    env.reset(0)
    for a in calls:  # stepped directly: each action its own turn
        env.step(a)
    assert env.turns == 3 and env.done
    st = start(env, 0)
    env.begin_turn(None, 5)  # a turn left open by the episode before ...
    env.reset(0)
    env.step(calls[0])
    assert env.turns == 1  # ... does not leak into the next one
