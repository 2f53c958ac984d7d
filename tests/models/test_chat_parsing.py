"""Parsing assistant output into actions, and what the rollout loop does with calls that do not parse.

A malformed call is never dropped: it becomes a tool error the agent sees (role tool, error true), as
τ²-bench does, and the episode goes on.
"""

from __future__ import annotations

import json

import pytest

from trace_cli.agents.base import text_turn
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout
from trace_cli.models.chat import parse_assistant, strip_text
from trace_cli.store.rollouts import tool_call_rows


def call(name, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


WELL_FORMED = [
    (
        call("get_order_details", {"order_id": "#W1234567"}),
        [{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}],
    ),
    # end-of-turn marker and an empty think block, as generated after the generation prompt
    (
        "<think>\n\n</think>\n\n" + call("find_user_id_by_email", {"email": "a@b.c"}) + "<|im_end|>",
        [{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}],
    ),
    # two calls in one turn, in order; compact JSON without newlines
    (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": [1, 2]}}</tool_call>',
        [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, 2]}}],
    ),
    # OpenAI transports arguments as a JSON string; an empty string is no arguments; omitted = {}
    (
        '<tool_call>{"name": "a", "arguments": "{\\"order_id\\": \\"#W1\\"}"}</tool_call>',
        [{"name": "a", "arguments": {"order_id": "#W1"}}],
    ),
    ('<tool_call>{"name": "a", "arguments": "  "}</tool_call>', [{"name": "a", "arguments": {}}]),
    ('<tool_call>{"name": "a"}</tool_call>', [{"name": "a", "arguments": {}}]),
    # unicode arguments survive
    (
        call("update_address", {"city": "Zürich", "line": "東京 1-2"}),
        [{"name": "update_address", "arguments": {"city": "Zürich", "line": "東京 1-2"}}],
    ),
]

TEXT = [
    ("Your order #W1 is delivered.", "Your order #W1 is delivered."),
    ("  Hello?  <|im_end|>ignored after the end marker", "Hello?"),
    ("<think>reasoning that is not shown</think>Done.", "Done."),
    ("Text<|endoftext|><|endoftext|>", "Text"),
    ("", ""),
]

MALFORMED = [
    ('<tool_call>{"name": "get_order_details", "arguments": {"order_id": </tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "get_order_details", "arguments": {}}\n', "unterminated"),
    ('<tool_call>{"name": "get_order_details", "arguments": {}}<|im_end|>', "unterminated"),
    ('<tool_call>{"arguments": {"order_id": "#W1"}}</tool_call>', "`name`"),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "`name`"),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', "`name`"),
    ('<tool_call>["get_order_details", {}]</tool_call>', "`name`"),
    ('<tool_call>{"name": "a", "arguments": "order_id=5"}</tool_call>', "`arguments` is not a JSON object"),
    ('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', "`arguments` must be a JSON object"),
    ('<tool_call>{"name": "a", "arguments": "[1, 2]"}</tool_call>', "`arguments` must be a JSON object"),
    ("<tool_call></tool_call>", "not valid JSON"),
]


@pytest.mark.parametrize(("text", "expected"), WELL_FORMED)
def test_well_formed_tool_calls(text, expected):
    assert parse_assistant(text) == expected


@pytest.mark.parametrize(("text", "expected"), TEXT)
def test_text_messages(text, expected):
    assert parse_assistant(text) == [{"content": expected}]
    assert strip_text(text) == expected


@pytest.mark.parametrize(("text", "why"), MALFORMED)
def test_malformed_calls_become_malformed_actions(text, why):
    actions = parse_assistant(text)
    assert len(actions) == 1
    (a,) = actions
    assert set(a) == {"malformed", "error"}, a
    assert why in a["error"]
    assert "name" not in a and "content" not in a  # never silently turned into a call or a message


def test_mixed_turn_keeps_order_and_marks_only_the_bad_call():
    text = call("a", {"x": 1}) + '\n<tool_call>{"name": "b", "arguments": {</tool_call>'
    first, second = parse_assistant(text)
    assert first == {"name": "a", "arguments": {"x": 1}}
    assert "malformed" in second and "not valid JSON" in second["error"]


# --------------------------------------------------------------------------------------------- rollout loop
class ScriptedText:
    """A policy whose turns are raw assistant text (as an HF model generates), from a per-seed script, parsed
    as every text policy parses its output (agents.base.text_turn)."""

    def __init__(self, scripts: dict[int, list[str]], default: str = "Goodbye."):
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.default = default

    def act(self, states):
        return [
            text_turn(self.scripts[s.seed].pop(0) if self.scripts[s.seed] else self.default) for s in states
        ]


def _reference(seed: int) -> list[dict]:
    env = make_env("shop")
    env.reset(seed)
    return env.reference_actions()


def _as_text(action: dict) -> str:
    return call(action["name"], action["arguments"]) if "name" in action else action["content"]


def test_rollout_answers_malformed_calls_with_tool_errors_and_keeps_going():
    seed = 0
    ref = _reference(seed)
    assert "name" in ref[0]
    bad = [
        '<tool_call>{"name": "find_user_id_by_email", "arguments": {"email": </tool_call><|im_end|>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',  # cut off: unterminated
    ]
    script = (
        bad[:2] + [_as_text(ref[0]) + "<|im_end|>", bad[2]] + [_as_text(a) + "<|im_end|>" for a in ref[1:]]
    )
    (ep,) = rollout(ScriptedText({seed: script}), lambda: make_env("shop"), [(seed, 0)], max_turns=20)

    # the agent recovered from three malformed calls and still solved the task
    assert ep.success and ep.reward == 1.0, ep.breakdown
    assert ep.n_errors == 3
    assert ep.n_actions == len(ref) + 3

    msgs = ep.messages[1:]  # after the system prompt
    assert msgs[0]["role"] == "user"
    errors = [(i, m) for i, m in enumerate(msgs) if m["role"] == "tool" and m.get("error")]
    assert len(errors) == 3
    for i, m in errors:
        assert m["content"].startswith("Error: malformed tool call:"), m
        prev = msgs[i - 1]
        # the assistant turn keeps the raw text (minus end-of-turn markers) so the agent sees its mistake
        assert prev["role"] == "assistant" and "<tool_call>" in prev["content"]
        assert "<|im_end|>" not in prev["content"]
        assert not prev.get("tool_calls")
        assert m["tool_call_id"].startswith("call_")
    assert "not valid JSON" in errors[0][1]["content"]
    assert "`name`" in errors[1][1]["content"]
    assert "unterminated" in errors[2][1]["content"]
    # the first well-formed call comes right after the two errors and succeeds
    good = msgs[errors[1][0] + 1]
    assert good["role"] == "assistant" and good["tool_calls"][0]["function"]["name"] == ref[0]["name"]
    assert msgs[errors[1][0] + 2]["role"] == "tool" and not msgs[errors[1][0] + 2]["error"]

    # the tool_calls table holds the parsed calls, each paired with its result
    rows = tool_call_rows("ep", ep.messages)
    assert [r["tool_name"] for r in rows] == [a["name"] for a in ref if "name" in a]
    assert all(r["result"] is not None and not r["error"] for r in rows)


def test_rollout_stops_an_agent_that_only_produces_malformed_calls():
    garbage = ["<tool_call>{oops</tool_call>"] * 40
    (ep,) = rollout(ScriptedText({3: garbage}), lambda: make_env("shop"), [(3, 0)], max_turns=30)
    assert ep.termination == "too_many_errors"
    assert ep.n_errors == 10 and ep.n_actions == 10
    assert not ep.success
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 10 and all(m["error"] for m in tool_msgs)


def test_rollout_max_turns_cuts_off_an_episode():
    (ep,) = rollout(
        ScriptedText({5: []}, default="Let me check that for you."),  # narration: the user says "Okay."
        lambda: make_env("shop?max_turns=50"),
        [(5, 0)],
        max_turns=4,
    )
    assert ep.termination == "max_turns" and ep.n_actions == 4
    assert [m["role"] for m in ep.messages[2:]] == ["assistant", "user"] * 4


def test_text_around_valid_calls_stays_in_the_transcript():
    seed = 0
    ref = _reference(seed)
    first = "<think>\n\n</think>\n\nLet me look up your account.\n" + _as_text(ref[0]) + "<|im_end|>"
    script = [first] + [_as_text(a) + "<|im_end|>" for a in ref[1:]]
    (ep,) = rollout(ScriptedText({seed: script}), lambda: make_env("shop"), [(seed, 0)], max_turns=20)
    assert ep.success
    turn = ep.messages[2]
    assert turn["role"] == "assistant" and turn["content"] == "Let me look up your account."
    assert turn["tool_calls"][0]["function"] == {"name": ref[0]["name"], "arguments": ref[0]["arguments"]}
    # a bare call has no text; and the parsed call is what the tool_calls table records
    assert ep.messages[4]["content"] == "" and ep.messages[4]["tool_calls"]
    assert [r["tool_name"] for r in tool_call_rows("ep", ep.messages)][0] == ref[0]["name"]
