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


def classifier_head(model, tok, skills: list[Skill]) -> tuple[list[int], list[tuple[Any, Any]]] | None:
    """(tokens, per-layer keys/values) of the classifier prompt's system message, the part every classification
    shares (the skill list: most of the prompt), run once through `model` (the base weights). None for a
    model with sliding-window layers (their cache keeps only the window)."""
    from transformers import DynamicCache

    from trace_cli.models.chat import render
    from trace_cli.models.prefix_cache import has_sliding_layers

    if has_sliding_layers(model.config):
        return None
    text = render(
        tok, [{"role": "system", "content": system_prompt(skills)}], None, add_generation_prompt=False
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        cache = model(
            input_ids=torch.tensor([ids], device=model.device), past_key_values=DynamicCache()
        ).past_key_values
    return ids, [(layer.keys, layer.values) for layer in cache.layers]


@torch.no_grad()
def classify(
    model, tok, prompts: list[str], ids: list[int], temperature: float, head=None
) -> list[list[float]]:
    """Softmax over the label tokens' log-probabilities at the next position, one row per prompt. With `head`
    (classifier_head), prompts that start with its tokens feed only what follows them (its keys/values
    reused); the LM head runs on the last position of each prompt only."""
    from transformers import DynamicCache

    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    n = 0
    if head is not None and all(len(r) > len(head[0]) and r[: len(head[0])] == head[0] for r in rows):
        n = len(head[0])
    tails = [r[n:] for r in rows]
    width = max(len(t) for t in tails)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    # right-padded: each row's real tokens keep their positions (n, n+1, ...); causal attention keeps the pads
    # after them out of their logits
    x = torch.tensor([t + [pad] * (width - len(t)) for t in tails], device=model.device)
    mask = torch.tensor([[1] * (n + len(t)) + [0] * (width - len(t)) for t in tails], device=model.device)
    past = None
    if n:
        past = DynamicCache(
            [(k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in head[1]]
        )
    last = sorted({len(t) - 1 for t in tails})
    out = model(
        input_ids=x,
        attention_mask=mask,
        past_key_values=past,
        use_cache=n > 0,
        logits_to_keep=torch.tensor(last, device=model.device),
    )
    at = torch.tensor([last.index(len(t) - 1) for t in tails], device=model.device)
    logits = out.logits[torch.arange(len(rows), device=model.device), at].float()
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
    """W' = W + sum_c alpha_c * scaling_c B_c A_c for the model's linear layers; `apply({})` restores the base
    weights. On a CPU (where a copy of the originals takes the model's own memory anyway) the base weights
    and the last mix's merged weights both stay resident and `apply` points the layers at one or the other
    (a switch back and forth costs no copy: the classifier runs on the base between a conversation's turns).
    Elsewhere the originals of every layer an expert touches are kept on the CPU and a mix is merged in place;
    so too where a target's weight is shared with another module (tied), which in-place writes keep tied."""

    def __init__(self, model, experts: list[LoraWeights], targets: list[str]):
        mods = dict(model.named_modules())
        self.layers = {n: mods[n] for n in targets}
        self.experts = experts
        own = {id(layer.weight) for layer in self.layers.values()}
        shared = {p.data_ptr() for p in model.parameters() if id(p) not in own}
        self.resident = all(
            layer.weight.device.type == "cpu" and layer.weight.data_ptr() not in shared
            for layer in self.layers.values()
        )
        self.original = {
            n: layer.weight.data if self.resident else layer.weight.detach().to("cpu", copy=True)
            for n, layer in self.layers.items()
        }
        self.current: tuple[tuple[int, float], ...] = ()
        self._merged: tuple[tuple, dict[str, torch.Tensor]] | None = None  # resident: (key, weights)

    def _mixed(self, n: str, mix: dict[int, float]) -> torch.Tensor:
        w = self.original[n].clone()
        for i, alpha in mix.items():
            d = self.experts[i - 1].delta(n)
            if d is not None:
                w += alpha * d
        return w

    @torch.no_grad()
    def apply(self, mix: dict[int, float]) -> None:
        """`mix`: expert index (1-based, as router labels) -> alpha."""
        key = tuple(sorted((i, round(a, 6)) for i, a in mix.items()))
        if key == self.current:
            return
        if not self.resident:
            for n, layer in self.layers.items():
                w = self._mixed(n, mix)
                layer.weight.copy_(w.to(layer.weight.device, layer.weight.dtype))
        elif not key or (self._merged is not None and self._merged[0] == key):
            ws = self._merged[1] if key else self.original  # type: ignore[index]
            for n, layer in self.layers.items():
                layer.weight.data = ws[n]
        else:
            self._merged = None  # a layer's previous mix is freed as its new one replaces it
            merged = {}
            for n, layer in self.layers.items():
                merged[n] = layer.weight.data = self._mixed(n, mix)
            self._merged = (key, merged)
        self.current = key
