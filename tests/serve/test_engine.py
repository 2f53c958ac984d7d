"""The serve engine's pure parts: where a forced tool call's arguments end, what a forced call's arguments are
when the model's text does not parse, the prefill per tool-call format."""

from __future__ import annotations

import json

from trace_cli.models.toolcalls import parse
from trace_cli.serve.engine import _json_closed, call_prefix, forced_arguments, to_completion


def test_a_forced_call_ends_when_its_arguments_close():
    head = '<tool_call>\n{"name": "get_order_details"'
    assert not _json_closed(head + ', "arguments": {"order_id": "#W1"')
    assert not _json_closed(head + ', "arguments": {"order_id": "}"}')  # inner object only
    assert not _json_closed(head + ', "arguments": {"a": {"b": 1}}')  # a nested object closed, not the call
    assert _json_closed(head + ', "arguments": {"a": {"b": 1}}}')
    assert _json_closed('{"name": "f", "parameters": {}}')  # llama3-json
    assert _json_closed('[TOOL_CALLS]f[ARGS]{"x": [1, 2]}')  # mistral v11: nothing to close after it
    assert not _json_closed("[TOOL_CALLS]f[ARGS]{")


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
    c = to_completion(text, [1, 2, 3], index=0, parse_tools=True, finish="length", forced=["cancel_order"])
    assert c.finish_reason == "tool_calls" and c.content is None
    assert [tc["function"]["name"] for tc in c.tool_calls] == ["cancel_order"]
    assert json.loads(c.tool_calls[0]["function"]["arguments"]) == {}  # no complete object: {}
    assert forced_arguments('<tool_call>\n{"name": "f", "arguments": {"a": 1}} junk', "f") == '{"a": 1}'
    # not forced: a malformed call stays the raw text (the eval loop sees the same malformed call)
    c = to_completion(text, [1, 2, 3], index=0, parse_tools=True, finish="length")
    assert not c.tool_calls and c.content == text
