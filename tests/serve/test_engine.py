"""The serve engine's pure parts: where a forced tool call's arguments end, what a forced call's arguments are
when the model's text does not parse, the prefill per tool-call format."""

from __future__ import annotations

import json

import pytest

from trace_cli.models.toolcalls import parse
from trace_cli.serve.completion import call_prefix, forced_arguments, json_closed, to_completion
from trace_cli.serve.requests import Message, RequestError, check_sequence


def test_a_forced_call_ends_when_its_arguments_close():
    head = '<tool_call>\n{"name": "get_order_details"'
    assert not json_closed(head + ', "arguments": {"order_id": "#W1"')
    assert not json_closed(head + ', "arguments": {"order_id": "}"}')  # inner object only
    assert not json_closed(head + ', "arguments": {"a": {"b": 1}}')  # a nested object closed, not the call
    assert json_closed(head + ', "arguments": {"a": {"b": 1}}}')
    assert json_closed('{"name": "f", "parameters": {}}')  # llama3-json
    assert json_closed('[TOOL_CALLS]f[ARGS]{"x": [1, 2]}')  # mistral v11: nothing to close after it
    assert not json_closed("[TOOL_CALLS]f[ARGS]{")


def test_every_format_s_prefill_parses_back_to_a_call_of_that_name():
    for fmt, tail in (
        ("hermes", ', "arguments": {"order_id": "#W1"}}\n</tool_call>'),
        ("llama3-json", ', "parameters": {"order_id": "#W1"}}'),
        ("mistral", ', "arguments": {"order_id": "#W1"}}]'),
        ("pythonic", 'order_id="#W1")]'),
    ):
        text = call_prefix(fmt, "get_order_details") + tail
        calls = [a for a in parse(text, fmt) if "name" in a]
        assert calls == [{"name": "get_order_details", "arguments": {"order_id": "#W1"}}], (fmt, text)
    v11 = call_prefix("mistral", "f", template="... [ARGS] ...") + '{"x": 1}'
    assert [a for a in parse(v11, "mistral") if "name" in a] == [{"name": "f", "arguments": {"x": 1}}]


def test_a_forced_call_is_a_call_whatever_the_model_wrote():
    text = '<tool_call>\n{"name": "cancel_order", "arguments": {"order_id": "#W1", "reason": '  # cut off
    closed = text + '"x"}}'
    c = to_completion(
        closed + " junk", [1, 2], index=0, parse_tools=True, finish="stop", forced=["cancel_order"]
    )
    assert c.finish_reason == "tool_calls" and c.content is None
    assert json.loads(c.tool_calls[0]["function"]["arguments"]) == {"order_id": "#W1", "reason": "x"}
    assert forced_arguments('<tool_call>\n{"name": "f", "arguments": {"a": 1}} junk', "f") == '{"a": 1}'
    # cut by max_tokens: "length" (as OpenAI), with the arguments as far as they were written, not "{}"
    c = to_completion(text, [1, 2, 3], index=0, parse_tools=True, finish="length", forced=["cancel_order"])
    assert c.finish_reason == "length" and c.content is None
    assert [tc["function"]["name"] for tc in c.tool_calls] == ["cancel_order"]
    assert c.tool_calls[0]["function"]["arguments"] == '{"order_id": "#W1", "reason": '
    # not forced: a malformed call stays the raw text (the eval loop sees the same malformed call)
    c = to_completion(text, [1, 2, 3], index=0, parse_tools=True, finish="length")
    assert not c.tool_calls and c.content == text and c.finish_reason == "length"
    # a complete call that max_tokens cut after it is still "length"
    c = to_completion(closed + "\n</tool_call>\nmore", [1], index=0, parse_tools=True, finish="length")
    assert c.tool_calls and c.finish_reason == "length"


def test_content_is_returned_as_generated():
    c = to_completion("  Hello there.\n\n<|im_end|>junk", [1], index=0, parse_tools=False, finish="stop")
    assert c.content == "  Hello there.\n\n"  # only the end marker and what follows go
    c = to_completion("<think>hm</think>\n\nYes. ", [1], index=0, parse_tools=True, finish="stop")
    assert c.content == "Yes. "  # a think block and the whitespace after it go


def test_message_sequences_openai_refuses():
    def err(messages):
        with pytest.raises(RequestError) as e:
            check_sequence([Message(**m) for m in messages])
        return e.value

    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}]}
    e = err([user, {"role": "tool", "tool_call_id": "c1", "content": "x"}])
    assert "must be a response to a preceeding message with 'tool_calls'" in e.message
    assert e.param == "messages.[1].role"
    e = err([user, call, {"role": "tool", "content": "x"}])
    assert e.param == "messages.[2].tool_call_id" and e.code == "missing_required_parameter"
    e = err([user, call, {"role": "tool", "tool_call_id": "c2", "content": "x"}])
    assert "'tool_call_id' of 'c2' not found in 'tool_calls' of previous message" in e.message
    e = err([user, call, user])
    assert "did not have response messages: c1" in e.message and e.param == "messages.[1].role"
    e = err([{"role": "user", "content": None}])
    assert e.message == "Invalid value for 'content': expected a string, got null."
    assert e.param == "messages.[0].content"
    check_sequence(
        [Message(**m) for m in (user, call, {"role": "tool", "tool_call_id": "c1", "content": "x"})]
    )
