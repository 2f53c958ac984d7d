"""Render conversations with the chat template and parse assistant output into actions.

Tool calls are `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen3). A call that cannot be
parsed is not dropped: it becomes a malformed action that the rollout loop answers with a tool error, as
τ²-bench does, so the agent sees its mistake and the transcript keeps it.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)
THINK_RE = re.compile(r"<think>.*?</think>", re.S)
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


def cut_at_end(text: str) -> str:
    """Drop everything from the first end-of-turn marker on (the chat template adds its own)."""
    for t in END_TOKENS:
        text = text.split(t)[0]
    return text


def strip_text(text: str) -> str:
    return THINK_RE.sub("", cut_at_end(text)).strip()


def parse_assistant(text: str) -> list[dict[str, Any]]:
    """Raw completion -> actions: tool calls `{"name", "arguments"}`, a message `{"content"}`, or
    `{"malformed": raw, "error": why}` for a tool call that does not parse."""
    body = strip_text(text)
    if "<tool_call>" not in body:
        return [{"content": body}]
    actions: list[dict[str, Any]] = []
    for m in TOOL_CALL_RE.finditer(body):
        raw = m.group(1).strip()
        if not m.group(2):
            actions.append({"malformed": raw, "error": "unterminated <tool_call> (missing </tool_call>)"})
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            actions.append({"malformed": raw, "error": f"tool call is not valid JSON: {e.msg}"})
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            actions.append({"malformed": raw, "error": "tool call needs a string `name`"})
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                actions.append({"malformed": raw, "error": "`arguments` is not a JSON object"})
                continue
        if not isinstance(args, dict):
            actions.append({"malformed": raw, "error": "`arguments` must be a JSON object"})
            continue
        actions.append({"name": obj["name"], "arguments": args})
    return actions or [{"malformed": body, "error": "empty tool call"}]


def render(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    template: str | None = None,
) -> str:
    """The prompt text for `messages` (system first) with the training (prefix-preserving) template."""
    from trace_cli.models.templates import qwen3_training_template

    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        chat_template=template or qwen3_training_template(),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=False,
    )
