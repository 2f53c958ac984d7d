"""Task-level router (the TRACE paper's composition): the frozen base model as a zero-shot classifier.

A system prompt lists one label per skill ("A: base - ...", "B: <capability> - <description>", ...); the last
`history` non-system messages of the conversation follow, then a final user message "Which skill?". The base
model's next-token log-probabilities of the label tokens, softmaxed (temperature 1), are the skill weights.
If "base" wins, no adapter is used; else top-1 takes the winner, top-p keeps the smallest set of labels whose
mass reaches p (renormalised) and merges them: W' = W + sum_c alpha_c B_c A_c (a "base" share adds nothing).

`WeightMerger` applies such a mix to the model's own linear weights (the originals are kept to restore), so
generation runs at the speed of a plain model: this is what the paper's serving code did per conversation.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import torch

from trace_cli.compose.adapters import LoraWeights
from trace_cli.errors import UsageError

LABELS = string.ascii_uppercase
QUESTION = "Which skill?"


@dataclass(frozen=True)
class Skill:
    name: str  # "base" or a capability
    description: str


def label_ids(tok, n: int) -> list[int]:
    """One token id per label A, B, ...; UsageError when the tokenizer splits a label."""
    if n > len(LABELS):
        raise UsageError(f"the router has {len(LABELS)} labels; {n} skills is too many")
    out = []
    for lab in LABELS[:n]:
        ids = tok(lab, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise UsageError(
                f"the base model's tokenizer splits the router label {lab!r} into {len(ids)} tokens"
            )
        out.append(ids[0])
    return out


def system_prompt(skills: list[Skill]) -> str:
    lines = [
        "You route a customer-service conversation to the skill that will help the assistant most.",
        "Skills:",
    ]
    lines += [f"{LABELS[i]}: {s.name} - {' '.join(s.description.split())}" for i, s in enumerate(skills)]
    lines.append("Answer with the label of one skill. Only output the label.")
    return "\n".join(lines)


def _as_text(m: dict[str, Any]) -> dict[str, Any]:
    """A history message as plain text for the classifier (tool calls written out, tool results as user text)."""
    role = m.get("role", "user")
    content = str(m.get("content") or "")
    if role == "assistant" and m.get("tool_calls"):
        import json

        calls = "; ".join(
            f"{c['function']['name']}({json.dumps(c['function'].get('arguments', {}), sort_keys=True)})"
            for c in m["tool_calls"]
        )
        content = (content + "\n" if content else "") + f"[tool calls: {calls}]"
    if role == "tool":
        return {"role": "user", "content": f"[tool result] {content}"}
    return {"role": "assistant" if role == "assistant" else "user", "content": content}


def classifier_prompt(tok, skills: list[Skill], messages: list[dict[str, Any]], history: int) -> str:
    from trace_cli.models.chat import render

    convo = [_as_text(m) for m in messages if m.get("role") != "system"][-history:]
    msgs = [
        {"role": "system", "content": system_prompt(skills)},
        *convo,
        {"role": "user", "content": QUESTION},
    ]
    return render(tok, msgs, None, add_generation_prompt=True)


@torch.no_grad()
def classify(model, tok, prompts: list[str], ids: list[int], temperature: float) -> list[list[float]]:
    """Softmax over the label tokens' log-probabilities at the next position, one row per prompt."""
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    logits = model(**enc, use_cache=False).logits[:, -1, :].float()
    lp = logits.log_softmax(-1)[:, ids]
    return (lp / temperature).softmax(-1).cpu().tolist()


def decide(probs: list[float], strategy: str, top_p: float) -> dict[int, float]:
    """Label index -> weight of the adapters to merge (index 0 = base: no adapter). Empty = base model."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if order[0] == 0:
        return {}
    if strategy == "top1":
        return {order[0]: 1.0}
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += probs[i]
        if mass >= top_p:
            break
    total = sum(probs[i] for i in kept)
    return {i: probs[i] / total for i in kept if i != 0}


class WeightMerger:
    """W' = W + sum_c alpha_c * scaling_c B_c A_c applied in place on the model's linear layers; `apply({})`
    restores the base weights. The originals are kept (on CPU) for every layer an expert touches."""

    def __init__(self, model, experts: list[LoraWeights], targets: list[str]):
        mods = dict(model.named_modules())
        self.layers = {n: mods[n] for n in targets}
        self.experts = experts
        self.original = {n: layer.weight.detach().to("cpu", copy=True) for n, layer in self.layers.items()}
        self.current: tuple[tuple[int, float], ...] = ()

    @torch.no_grad()
    def apply(self, mix: dict[int, float]) -> None:
        """`mix`: expert index (1-based, as router labels) -> alpha."""
        key = tuple(sorted((i, round(a, 6)) for i, a in mix.items()))
        if key == self.current:
            return
        for n, layer in self.layers.items():
            w = self.original[n].clone()
            for i, alpha in mix.items():
                d = self.experts[i - 1].delta(n)
                if d is not None:
                    w += alpha * d
            layer.weight.copy_(w.to(layer.weight.device, layer.weight.dtype))
        self.current = key
