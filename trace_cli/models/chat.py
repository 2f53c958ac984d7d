"""Render conversations with the chat template and parse assistant output into actions.

Tool calls are `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen3). A call that cannot be
parsed is not dropped: it becomes a malformed action that the rollout loop answers with a tool error, as
τ²-bench does, so the agent sees its mistake and the transcript keeps it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trace_cli.errors import json_error

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)
THINK_RE = re.compile(r"<think>.*?</think>", re.S)
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "</s>")


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
        except (ValueError, RecursionError) as e:
            actions.append({"malformed": raw, "error": f"tool call is not valid JSON: {json_error(e)}"})
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


GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_marks(template: str) -> bool:
    """Does the template mark the assistant's tokens with `{% generation %}` (assistant-only loss)?"""
    return GENERATION_MARK.search(template) is not None


def template_for(tokenizer) -> str:
    """The template a model is prompted and trained with: its own (`trace model import` stored the one chosen
    there), except TRL's Qwen3 original (the presets), which maps to its prefix-preserving training variant;
    a tokenizer without any template gets that one too."""
    from trace_cli.models.templates import qwen3_template, qwen3_training_template

    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str) or not own or own == qwen3_template():
        return qwen3_training_template()
    return own


def render(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    template: str | None = None,
) -> str:
    """The prompt text for `messages` (system first) with the model's (prefix-preserving) template."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        chat_template=template or template_for(tokenizer),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=False,
    )


def eos_ids(tokenizer, generation_config=None) -> list[int]:
    """Every stop token id: the tokenizer's eos and each eos id of the generation config (never a literal)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    g = getattr(generation_config, "eos_token_id", None)
    for i in g if isinstance(g, list | tuple) else [g]:
        if i is not None:
            ids.add(int(i))
    return sorted(ids)


def assistant_spans(tokenizer, messages, tools, template: str | None = None) -> list[tuple[str, str]]:
    """(prompt before assistant turn k, rendering through turn k) for every assistant message k."""
    out = []
    for k, m in enumerate(messages):
        if m.get("role") == "assistant":
            prompt = render(tokenizer, messages[:k], tools, add_generation_prompt=True, template=template)
            full = render(tokenizer, messages[: k + 1], tools, add_generation_prompt=False, template=template)
            out.append((prompt, full))
    return out


def prefix_problems(tokenizer, episodes, template: str | None = None, limit: int = 3) -> list[str]:
    """Turns at which the template is not prefix-preserving, in text or in tokens (GRPO and SFT need both):
    the prompt the model acts on must be an exact prefix of the transcript it is trained on."""
    bad: list[str] = []
    for ep in episodes:
        for k, (prompt, full) in enumerate(assistant_spans(tokenizer, ep["messages"], ep["tools"], template)):
            if not full.startswith(prompt):
                bad.append(f"turn {k}: the rendered prompt is not a prefix of the rendered transcript")
            else:
                p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                f = tokenizer(full, add_special_tokens=False)["input_ids"]
                if f[: len(p)] != p:
                    bad.append(f"turn {k}: the prompt's tokens are not a prefix of the transcript's tokens")
            if len(bad) >= limit:
                return bad
    return bad
