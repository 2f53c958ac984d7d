"""Tool-call parsers per model family: Hermes `<tool_call>{json}</tool_call>`, Llama-3 JSON
(`{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`), Mistral `[TOOL_CALLS]` (v3 JSON
list and v11 `name[ARGS]{json}`) and pythonic (`[f(a=1), g(b="x")]`).

Every parser maps a completion (end-of-turn already cut) to actions: tool calls `{"name", "arguments"}`,
`{"malformed": raw, "error": why}` for a call that does not parse, and, for the non-Hermes formats, a
`{"content": text}` action with the text outside the calls (possibly empty), so the transcript never keeps
call markup as prose. When the tokenizer carries a transformers `response_template`, its own parser
(`tokenizer.parse_response`) is used first.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from trace_cli.errors import json_error

FORMATS = ("hermes", "llama3-json", "mistral", "pythonic")
PYTHON_TAG = "<|python_tag|>"


def _call(name: Any, args: Any, raw: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        return {"malformed": raw, "error": "tool call needs a string `name`"}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):  # not JSON, a number too long, nested too deep
            return {"malformed": raw, "error": "`arguments` is not a JSON object"}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return {"malformed": raw, "error": "`arguments` must be a JSON object"}
    return {"name": name, "arguments": args}


def _with_content(content: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"content": content.strip()}] + calls


def parse_llama3_json(body: str) -> list[dict[str, Any]]:
    """`{"name": f, "parameters": {...}}` objects (one per line or `;`-separated), optionally after
    `<|python_tag|>`; text that is not such an object is a message."""
    text = body.split(PYTHON_TAG, 1)[1] if PYTHON_TAG in body else body
    s = text.strip()
    if not (s.startswith("{") and '"name"' in s):
        return [{"content": body.strip()}]
    calls: list[dict[str, Any]] = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(s):
        while i < len(s) and s[i] in " \t\r\n;,":
            i += 1
        if i >= len(s):
            break
        try:
            obj, end = dec.raw_decode(s, i)
        except (ValueError, RecursionError) as e:
            calls.append({"malformed": s[i:], "error": f"tool call is not valid JSON: {json_error(e)}"})
            break
        if not isinstance(obj, dict):
            calls.append({"malformed": s[i:end], "error": "a tool call must be a JSON object"})
        else:
            args = obj.get("parameters", obj.get("arguments", {}))
            calls.append(_call(obj.get("name"), args, s[i:end]))
        i = end
    return _with_content("", calls)


MISTRAL_V11 = re.compile(r"([A-Za-z_][\w.\-]*)\[ARGS\]", re.S)


def parse_mistral(body: str) -> list[dict[str, Any]]:
    """`[TOOL_CALLS][{"name": f, "arguments": {...}}, ...]` (v3) or `[TOOL_CALLS]f[ARGS]{...}` (v11+)."""
    if "[TOOL_CALLS]" not in body:
        return [{"content": body.strip()}]
    content, _, rest = body.partition("[TOOL_CALLS]")
    calls: list[dict[str, Any]] = []
    dec = json.JSONDecoder()
    for part in rest.split("[TOOL_CALLS]"):
        p = part.strip()
        if not p:
            continue
        m = MISTRAL_V11.match(p)
        if m:
            pos = m.end()
            while True:
                try:
                    args, end = dec.raw_decode(p, pos)
                except (ValueError, RecursionError) as e:
                    calls.append(
                        {"malformed": p, "error": f"tool call arguments are not valid JSON: {json_error(e)}"}
                    )
                    break
                calls.append(_call(m.group(1), args, p[m.start() : end]))
                m = MISTRAL_V11.match(p, _skip_ws(p, end))
                if not m:
                    break
                pos = m.end()
            continue
        try:
            obj, _ = dec.raw_decode(p)
        except (ValueError, RecursionError) as e:
            calls.append({"malformed": p, "error": f"tool calls are not valid JSON: {json_error(e)}"})
            continue
        for o in obj if isinstance(obj, list) else [obj]:
            if not isinstance(o, dict):
                calls.append({"malformed": json.dumps(o), "error": "a tool call must be a JSON object"})
                continue
            calls.append(_call(o.get("name"), o.get("arguments", o.get("parameters", {})), json.dumps(o)))
    return _with_content(content, calls or [{"malformed": rest, "error": "empty [TOOL_CALLS]"}])


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def parse_pythonic(body: str) -> list[dict[str, Any]]:
    """`[f(a=1, b="x"), g()]` (Llama 3.2 / Llama 4 pythonic calls): keyword arguments with literal values."""
    s = body.split(PYTHON_TAG, 1)[1].strip() if PYTHON_TAG in body else body.strip()
    if not (s.startswith("[") and s.endswith("]") and "(" in s):
        return [{"content": body.strip()}]
    try:
        tree = ast.parse(s, mode="eval")
    except SyntaxError as e:
        return _with_content("", [{"malformed": s, "error": f"tool calls are not a Python list: {e.msg}"}])
    if not isinstance(tree.body, ast.List):
        return [{"content": body.strip()}]
    calls: list[dict[str, Any]] = []
    for node in tree.body.elts:
        raw = ast.get_source_segment(s, node) or s
        if not isinstance(node, ast.Call) or node.args:
            calls.append({"malformed": raw, "error": "each tool call must be name(key=value, ...)"})
            continue
        name = _dotted(node.func)
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except ValueError:
            calls.append({"malformed": raw, "error": "tool call arguments must be literals"})
            continue
        calls.append(_call(name, args, raw))
    return _with_content("", calls)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def parse_with_transformers(tokenizer, text: str) -> list[dict[str, Any]] | None:
    """transformers' own response parsing (`tokenizer.response_template`), when the tokenizer has one."""
    if tokenizer is None or getattr(tokenizer, "response_template", None) is None:
        return None
    try:
        msg = tokenizer.parse_response(text, prefix="")
    except Exception:  # noqa: BLE001 - a response its parser rejects falls back to ours
        return None
    calls = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function", tc)
        calls.append(_call(fn.get("name"), fn.get("arguments", {}), json.dumps(fn, default=str)))
    content = msg.get("content") or ""
    return (
        _with_content(content if isinstance(content, str) else "", calls) if calls else [{"content": content}]
    )


def parse(text: str, fmt: str = "hermes", tokenizer=None) -> list[dict[str, Any]]:
    """A completion -> actions, for tool-call format `fmt` (see FORMATS)."""
    from trace_cli.models.chat import parse_assistant, strip_text

    got = parse_with_transformers(tokenizer, text)
    if got is not None:
        return got
    if fmt == "hermes":
        return parse_assistant(text)
    body = strip_text(text)
    if fmt == "llama3-json":
        return parse_llama3_json(body)
    if fmt == "mistral":
        return parse_mistral(body)
    if fmt == "pythonic":
        return parse_pythonic(body)
    raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {', '.join(FORMATS)}")
