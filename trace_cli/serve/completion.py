"""A generated turn -> an OpenAI choice: the model family's tool-call parser gives `tool_calls`, content is the
text as generated (end-of-turn marker and `<think>` block dropped, nothing stripped), and a forced
`tool_choice` prefills the start of a call and ends it when its arguments close."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from trace_cli.models.chat import THINK_RE, TOOL_CALL_RE, cut_at_end, parse_assistant, strip_text


def as_generated(text: str) -> str:
    """A reply's content as the model wrote it: up to its end-of-turn marker, a `<think>` block (and the
    whitespace after it) dropped; other whitespace kept."""
    body = cut_at_end(text)
    shown = THINK_RE.sub("", body)
    return shown.lstrip() if shown != body else shown


def call_prefix(fmt: str, name: str, template: str | None = None) -> str:
    """The start of a call to `name` in tool-call format `fmt`, up to the name's end: what a forced
    `tool_choice` prefills (the model writes the arguments)."""
    if fmt == "hermes":
        return f'<tool_call>\n{{"name": "{name}"'
    if fmt == "llama3-json":
        return f'{{"name": "{name}"'
    if fmt == "mistral":
        return (
            f"[TOOL_CALLS]{name}[ARGS]"
            if "[ARGS]" in (template or "")
            else f'[TOOL_CALLS][{{"name": "{name}"'
        )
    if fmt == "pythonic":
        return f"[{name}("
    raise ValueError(f"unknown tool-call format {fmt!r}")


@dataclass
class Completion:
    index: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    completion_tokens: int


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments
            if isinstance(arguments, str)
            else json.dumps(arguments, ensure_ascii=False),
        },
    }


def forced_arguments(text: str, name: str) -> str:
    """The arguments of a forced call to `name` whose text does not parse: the first JSON object after the
    name (the model's own, as OpenAI returns arguments it does not validate), `{}` when there is none."""
    body = strip_text(text)
    at = body.find(name)
    rest = body[at + len(name) :] if at >= 0 else body
    dec = json.JSONDecoder()
    for i, ch in enumerate(rest):
        if ch == "{":
            try:
                obj, _ = dec.raw_decode(rest, i)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return json.dumps(obj.get("arguments", obj.get("parameters", obj)), ensure_ascii=False)
    return "{}"


def partial_arguments(text: str) -> str:
    """The arguments of a call that `max_tokens` cut, as far as the model wrote them (OpenAI returns them
    so, with finish_reason "length"): the text after `"arguments":` (`"parameters":`, `[ARGS]`, `name(`)."""
    body = cut_at_end(text)
    for key in ('"arguments":', '"parameters":', "[ARGS]", "("):
        at = body.find(key)
        if at >= 0:
            return body[at + len(key) :].lstrip()
    return ""


def to_completion(
    text: str,
    ids: list[int],
    *,
    index: int,
    max_tokens: int | None = None,
    parse_tools: bool,
    stop: list[str] | None = None,
    eos_id: int | list[int] | None = None,
    parse=None,
    finish: str | None = None,
    forced: list[str] | None = None,
) -> Completion:
    """A generated turn -> an OpenAI choice. Parsed as `trace eval` parses it: valid calls become `tool_calls`
    (content = the text around them, null when there is none); a turn with a call that does not parse is
    returned as its raw text, so a client that parses it (the eval loop does) sees the same malformed call.
    Under a forced `tool_choice` (`forced`: the names allowed) the turn is a call whatever the model wrote.
    `finish` is the engine's reason; without it, it is derived from the ids (stop token or length). A reply
    that max_tokens cut is "length", whatever it holds."""
    if finish is None:
        stops = set(eos_id) if isinstance(eos_id, list) else {eos_id}
        finish = "stop" if stops & set(ids) or len(ids) < (max_tokens or 0) else "length"
    # the model family's parser (HFPolicy.parse); Hermes `<tool_call>` by default
    actions = (parse or parse_assistant)(text) if parse_tools else [{"content": as_generated(text)}]
    named = [a for a in actions if "name" in a]
    if forced and not (named and all(a["name"] in forced for a in named)):
        # the prefill named the function; the model's arguments are taken as it wrote them
        name = next((n for n in forced if n in text), forced[0])
        if finish == "length":
            return Completion(index, None, [_call(name, partial_arguments(text))], finish, len(ids))
        return Completion(index, None, [_call(name, forced_arguments(text, name))], "tool_calls", len(ids))
    calls: list[dict[str, Any]] = []
    if any("malformed" in a for a in actions):
        content: str | None = cut_at_end(text)
    elif named:
        said = next((a["content"] for a in actions if "content" in a), None)
        content = said if said is not None else TOOL_CALL_RE.sub("", strip_text(text)).strip()
        calls = [_call(a["name"], a["arguments"]) for a in named]
        finish = "length" if finish == "length" else "tool_calls"
        content = content or None  # OpenAI: a reply that is only tool calls has content null
    else:
        content = as_generated(text)
    if stop and content and not calls:  # the engine ends generation at a stop string; this is for callers
        cuts = [content.find(s) for s in stop if s and s in content]
        if cuts:
            content, finish = content[: min(cuts)], "stop"
    return Completion(index, content, calls, finish, len(ids))


_DEC = json.JSONDecoder()


def json_closed(text: str) -> bool:
    """Whether a forced call's arguments are complete: the JSON object after `"arguments":` (`"parameters":`,
    `[ARGS]`) decodes and the call's own object is closed after it (or there is none to close: `[ARGS]`)."""
    if not text.endswith("}"):
        return False
    at = max(text.rfind('"arguments":'), text.rfind('"parameters":'))
    if at >= 0:
        rest, tail = text[at:].split(":", 1)[1].lstrip(), "}"
    elif "[ARGS]" in text:
        rest, tail = text[text.rfind("[ARGS]") + 6 :].lstrip(), ""
    else:
        return False
    try:
        obj, end = _DEC.raw_decode(rest)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and rest[end:].strip() == tail
