"""The `rules` analyst's detectors on handcrafted trajectories: NA, PRESENT and LACKING for each."""

from __future__ import annotations

import pytest

from trace_cli.analysts import rules
from trace_cli.analysts.base import LACKING, NA, PRESENT, Candidate, Trajectory
from trace_cli.errors import UsageError

ORDER = '{"order_id": "#W1", "status": "pending", "items": [{"item_id": "111", "price": 10}, {"item_id": "222", "price": 20}]}'


def T(b) -> Trajectory:  # noqa: N802
    return Trajectory.from_episode(b.build())


# ------------------------------------------------------------------ precondition_verification


def test_precondition_na_without_writes(ep):
    t = T(ep(reference=[]).user("Where is #W1?").call("get_order", {"order_id": "#W1"}, ORDER))
    assert rules.precondition_verification(t)[0] == NA


READ_W1 = ("get_order", {"order_id": "#W1"}, ORDER)
CANCEL_W1 = ("cancel_order", {"order_id": "#W1"}, '{"status": "cancelled"}')
BOTH = "Cancel #W1 and move #W2 to Paris"


def _episode(ep, reference, user: str, *turns):
    """A trajectory: the user's request, then each turn a tool call (name, arguments, result[, error]) or an
    agent message."""
    b = ep(reference=reference).user(user)
    for turn in turns:
        b = b.agent(turn) if isinstance(turn, str) else b.call(*turn[:3], error=len(turn) > 3 and turn[3])
    return T(b)


def test_precondition_present_when_read_first(ep):
    ref = [
        {"name": "get_order", "arguments": {"order_id": "#W1"}},
        {"name": "cancel_order", "arguments": {"order_id": "#W1"}},
    ]
    t = _episode(ep, ref, "Cancel #W1", READ_W1, CANCEL_W1)
    assert rules.precondition_verification(t)[0] == PRESENT


def test_precondition_lacking_when_write_without_read(ep):
    ref = [{"name": "cancel_order", "arguments": {"order_id": "#W1"}}]
    lab, why = rules.precondition_verification(_episode(ep, ref, "Cancel #W1", CANCEL_W1))
    assert lab == LACKING and "without reading" in why


def test_precondition_lacking_when_reference_forbids_the_write(ep):
    ref = [{"name": "get_order", "arguments": {"order_id": "#W1"}}]
    lab, why = rules.precondition_verification(_episode(ep, ref, "Cancel #W1", READ_W1, CANCEL_W1))
    assert lab == LACKING and "reference does not do it" in why


# ------------------------------------------------------------------ multi_step_completion

TWO_WRITES = [
    {"name": "cancel_order", "arguments": {"order_id": "#W1"}},
    {"name": "modify_order_address", "arguments": {"order_id": "#W2", "city": "Paris"}},
]


def test_multi_step_na_without_reference_or_with_one_write(ep):
    assert rules.multi_step_completion(T(ep(reference=None).user("hi")))[0] == NA
    one = [{"name": "cancel_order", "arguments": {"order_id": "#W1"}}]
    assert rules.multi_step_completion(T(ep(reference=one).user("hi")))[0] == NA


def test_multi_step_lacking_when_some_but_not_all_writes_done(ep):
    lab, why = rules.multi_step_completion(_episode(ep, TWO_WRITES, BOTH, CANCEL_W1, "All done!"))
    assert lab == LACKING and "1 of 2" in why


def test_multi_step_present_when_all_or_none_done(ep):
    move_w2 = ("modify_order_address", {"order_id": "W2", "city": "Paris"}, "{}")
    t = _episode(ep, TWO_WRITES, BOTH, CANCEL_W1, move_w2)
    assert rules.multi_step_completion(t)[0] == PRESENT  # "W2" matches "#W2" by value
    none = _episode(ep, TWO_WRITES, BOTH, "I cannot do that.")
    lab, why = rules.multi_step_completion(none)
    assert lab == PRESENT and "borderline" in why


def test_multi_step_failed_write_does_not_count(ep):
    failed = ("modify_order_address", {"order_id": "#W2", "city": "Paris"}, "Error: address invalid", True)
    assert rules.multi_step_completion(_episode(ep, TWO_WRITES, "x", CANCEL_W1, failed))[0] == LACKING


# ------------------------------------------------------------------ tool_calling_precision


def test_tool_precision_na_without_calls(ep):
    assert (
        rules.tool_calling_precision(T(ep(reference=[]).user("hi").agent("Hello, how can I help?")))[0] == NA
    )


def test_tool_precision_present_for_exact_calls(ep):
    ref = [{"name": "get_order", "arguments": {"order_id": "#W1"}}]
    t = T(ep(reference=ref).user("Where is #W1?").call("get_order", {"order_id": "#W1"}, ORDER))
    assert rules.tool_calling_precision(t)[0] == PRESENT


def test_tool_precision_lacking_on_schema_error(ep):
    t = T(
        ep(reference=None)
        .user("Where is #W1?")
        .call("get_order", {"id": "#W1"}, "Error: missing required argument 'order_id'", error=True)
    )
    lab, why = rules.tool_calling_precision(t)
    assert lab == LACKING and "rejected" in why


def test_tool_precision_lacking_on_argument_format(ep):
    ref = [{"name": "get_order", "arguments": {"order_id": "#W1"}}]
    t = T(ep(reference=ref).user("Where is W1?").call("get_order", {"order_id": "W1"}, ORDER))
    lab, why = rules.tool_calling_precision(t)
    assert lab == LACKING and "format" in why and "order_id" in why


def test_tool_precision_lacking_on_malformed_call(ep):
    t = T(ep(reference=None).user("hi").tool_text("Error: malformed tool call: not valid JSON"))
    assert rules.tool_calling_precision(t)[0] == LACKING


# ------------------------------------------------------------------ structured_data_reasoning

RETURN_CHEAPER = [
    {"name": "get_order", "arguments": {"order_id": "#W1"}},
    {"name": "return_items", "arguments": {"order_id": "#W1", "item_ids": ["111"]}},
]


def test_structured_data_na(ep):
    assert rules.structured_data_reasoning(T(ep(reference=None).user("hi")))[0] == NA
    # every value of the reference came from the user: nothing was chosen from data
    t = T(
        ep(reference=[{"name": "get_order", "arguments": {"order_id": "#W1"}}])
        .user("Where is #W1?")
        .call("get_order", {"order_id": "#W1"}, ORDER)
    )
    assert rules.structured_data_reasoning(t)[0] == NA


def test_structured_data_lacking_when_wrong_value_chosen_from_shown_data(ep):
    t = T(
        ep(reference=RETURN_CHEAPER)
        .user("Return the cheaper item of order #W1.")
        .call("get_order", {"order_id": "#W1"}, ORDER)
        .call("return_items", {"order_id": "#W1", "item_ids": ["222"]}, '{"status": "return requested"}')
    )
    lab, why = rules.structured_data_reasoning(t)
    assert lab == LACKING and "item_ids" in why


def test_structured_data_present_when_right_value_chosen(ep):
    t = T(
        ep(reference=RETURN_CHEAPER)
        .user("Return the cheaper item of order #W1.")
        .call("get_order", {"order_id": "#W1"}, ORDER)
        .call("return_items", {"order_id": "#W1", "item_ids": ["111"]}, '{"status": "return requested"}')
    )
    assert rules.structured_data_reasoning(t)[0] == PRESENT


# ------------------------------------------------------------------ policy_compliance_under_pressure

REF_READ_ONLY = [{"name": "get_order", "arguments": {"order_id": "#W1"}}]


def _refused(ep):
    return (
        ep(reference=REF_READ_ONLY)
        .user("Cancel #W1")
        .call("get_order", {"order_id": "#W1"}, ORDER)
        .agent("Sorry, I cannot cancel an order that has been delivered.")
    )


def test_policy_na_without_refusal_or_pushback(ep):
    t = T(ep(reference=REF_READ_ONLY).user("Where is #W1?").agent("It is on its way."))
    assert rules.policy_compliance_under_pressure(t)[0] == NA
    t = T(_refused(ep).user("OK, thanks, bye."))
    assert rules.policy_compliance_under_pressure(t)[0] == NA


def test_policy_lacking_when_agent_gives_in(ep):
    t = T(_refused(ep).user("I insist, cancel it now!").call("cancel_order", {"order_id": "#W1"}, "{}"))
    lab, why = rules.policy_compliance_under_pressure(t)
    assert lab == LACKING and "cancel_order" in why


def test_policy_present_when_agent_holds(ep):
    t = T(
        _refused(ep).user("I insist, cancel it now!").agent("I understand, but I am not able to cancel it.")
    )
    assert rules.policy_compliance_under_pressure(t)[0] == PRESENT


# ------------------------------------------------------------------ distractors


def test_distractors(ep):
    silent = T(ep().user("hi").call("get_order", {"order_id": "#W1"}, ORDER))
    for det in (rules.tone_and_empathy, rules.language_fluency, rules.proactive_upselling):
        assert det(silent)[0] == NA
    polite = T(ep().user("hi").agent("Thanks for waiting, your order has shipped today."))
    curt = T(ep().user("hi").agent("Shipped."))
    assert rules.tone_and_empathy(polite)[0] == PRESENT
    assert rules.tone_and_empathy(curt)[0] == LACKING
    assert rules.language_fluency(polite)[0] == PRESENT
    assert rules.language_fluency(curt)[0] == LACKING
    garbled = T(ep().user("hi").agent("order order order order shipped"))
    assert rules.language_fluency(garbled)[0] == LACKING
    upsell = T(ep().user("hi").agent("It shipped. You might also like our premium shipping."))
    assert rules.proactive_upselling(upsell)[0] == PRESENT
    assert rules.proactive_upselling(polite)[0] == LACKING


# ------------------------------------------------------------------ the analyst


def test_rules_analyst_labels_every_pair_and_na_without_rule(ep):
    eps = [
        ep("a", reference=[]).user("hi").agent("Hello there, how can I help?").build(),
        ep("b", success=True, reference=[]).user("hi").agent("Hello there, happy to help.").build(),
    ]
    cands = [Candidate("tone_and_empathy", "x" * 20), Candidate("made_up_capability", "y" * 20)]
    a = rules.RulesAnalyst({})
    labels = a.label(eps, cands, run=3, seed=0)
    assert [(lb.episode_id, lb.capability, lb.run) for lb in labels] == [
        ("a", "tone_and_empathy", 3),
        ("a", "made_up_capability", 3),
        ("b", "tone_and_empathy", 3),
        ("b", "made_up_capability", 3),
    ]
    assert labels[1].label == NA and "no rule" in labels[1].rationale
    assert a.deterministic and a.label(eps, cands, 3, 1) == labels


def test_rules_analyst_cannot_discover():
    with pytest.raises(UsageError, match="cannot discover"):
        rules.RulesAnalyst().discover([], 5, 0)


def test_tool_precision_detects_every_precision_deficit_of_the_shop_and_nothing_else():
    """Replayed on the shop: each family's tool_calling_precision deficit demonstration (zip as a number or
    without its leading zero, the state spelled out, address lines merged, a truncated user id, ids of the
    wrong kind or format) is LACKING; the references and the other capabilities' deficits are not."""
    from trace_cli.analysts.rules import tool_calling_precision
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import replay

    def label(env, seed, actions) -> str:
        r = replay(env, seed, actions)
        ep = {"episode_id": str(seed), "task_id": r.task_id, "success": r.success, "reward": r.reward}
        ep |= {"messages": r.messages, "reference_actions": r.metadata["reference_actions"]}
        return tool_calling_precision(Trajectory.from_episode(ep))[0]

    env = make_env("shop")
    variants = set()
    for seed in range(240):
        env.reset(seed)
        task = env._task
        assert label(env, seed, env.reference_actions()) != LACKING, (seed, task.family)
        for cap in task.capabilities:
            want = LACKING if cap == "tool_calling_precision" else PRESENT
            got = label(env, seed, env.demonstration({cap}))
            assert got == want or (want == PRESENT and got == NA), (seed, task.family, task.variant, cap, got)
            variants |= {task.variant} if cap == "tool_calling_precision" else set()
    assert {"state_spelled_out", "address_lines_merged", "user_id_without_suffix"} <= variants
