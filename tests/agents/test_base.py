"""agents.base: the one Policy protocol, and generated text -> structured turns (the rollout loop parses none)."""

from __future__ import annotations

import pytest

from trace_cli.agents.base import Policy, as_turn, text_turn
from trace_cli.agents.scripted import DemonstrationPolicy, RandomPolicy, ReferencePolicy
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import Turn, apply_actions, rollout, start


def test_plain_text_is_a_message():
    t = text_turn("Your order has shipped.<|im_end|>")
    assert t.actions == [{"content": "Your order has shipped."}]
    assert t.raw == "Your order has shipped.<|im_end|>"


def test_text_around_valid_calls_is_kept_without_markup():
    raw = 'Let me check.\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call><|im_end|>'
    t = text_turn(raw)
    assert t.actions == [{"name": "get_order_details", "arguments": {"order_id": "#W1"}}]
    assert t.text == "Let me check."
    st = start(make_env("shop"), 0)
    apply_actions(st, t, max_turns=5)
    msg = next(m for m in st.messages if m["role"] == "assistant")
    assert (
        msg["content"] == "Let me check." and msg["tool_calls"][0]["function"]["name"] == "get_order_details"
    )


def test_a_malformed_call_keeps_the_raw_turn_up_to_its_end_marker():
    raw = "<tool_call>\n{not json}\n</tool_call><|im_end|>junk"
    t = text_turn(raw)
    assert "malformed" in t.actions[0]
    assert t.text == "<tool_call>\n{not json}\n</tool_call>"
    st = start(make_env("shop"), 0)
    apply_actions(st, t, max_turns=5)
    assert st.messages[-2] == {"role": "assistant", "content": t.text}
    assert st.messages[-1]["error"] and st.n_errors == 1


def test_a_family_parser_says_what_was_written_outside_its_calls():
    def parse(text):
        return [{"content": "Checking."}, {"name": "get_user", "arguments": {}}]

    assert text_turn("anything", parse).text == "Checking."


def test_structured_outputs_pass_through():
    actions = [{"name": "f", "arguments": {}}]
    assert as_turn(actions) == Turn(actions)
    t = Turn([{"content": "hi"}], raw="hi")
    assert as_turn(t) is t
    assert as_turn("hello") == text_turn("hello")


def test_the_loop_takes_turns_only():
    class Texty:
        name = "texty"

        def act(self, states):
            return ["hello" for _ in states]

    with pytest.raises(TypeError, match="structured turns"):
        rollout(Texty(), lambda: make_env("shop"), [(0, 0)], max_turns=2)


def test_every_builtin_is_a_policy():
    for policy in (
        ReferencePolicy(),
        DemonstrationPolicy({"precondition_verification"}, 1.0, 0),
        RandomPolicy(3),
    ):
        assert isinstance(policy.name, str) and callable(policy.act)
        p: Policy = policy  # the protocol every agent implements
        (ep,) = rollout(p, lambda: make_env("shop"), [(1, 0)], max_turns=12)
        assert ep.n_actions >= 1
