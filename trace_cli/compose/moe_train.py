"""Train the MoE gates on labelled transcripts and measure routing accuracy on held-out turns.

Labels are per assistant turn (`Transcript.labels`; a transcript with one slot for every turn is the special
case, `Transcript.slot`). Where they come from is `compose.moe_data`'s business. On the tokens: every token after
the system prompt carries a label; an assistant turn's tokens carry that turn's, and the tokens before it (the
user's messages and tool results it answers, which is where the routing for that turn is decided as the gates
read them) carry the same; tokens after the last assistant turn carry the last turn's. The loss is the
cross-entropy of every gate's logits against the token labels (class-balanced over the labelled tokens, averaged
over layers) plus a small Switch load-balancing term. Base model and LoRA experts stay frozen; only the gates train.

Held out by conversation (`split`, by episode key: no turn of a held-out conversation trains), stratified by each
transcript's `slot` (for per-turn labels: its expert, the first non-base label, else base). Routing accuracy is
measured per held-out assistant turn: the turn's expert is the most chosen slot over its tokens and all gated
layers, as routed during a forward pass over the whole transcript (what generation sees); it is reported per slot
with its turns and the number of held-out conversations with a turn of that slot.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from trace_cli.compose.moe import GatedLoraLinear, RoutingTrace, turn_votes


@dataclass
class Transcript:
    slot: int  # the conversation's slot: every turn's when `labels` is None, else its stratum for the split
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    key: str  # episode identity (for the held-out split)
    labels: list[int] | None = None  # one slot per assistant message, in order

    def turn_labels(self) -> list[int]:
        n = sum(1 for m in self.messages if m.get("role") == "assistant")
        return list(self.labels) if self.labels is not None else [self.slot] * n


def stratum(labels: list[int]) -> int:
    """The slot a per-turn-labelled conversation is filed under: its first expert label, else base."""
    return next((x for x in labels if x), 0)


@dataclass
class Example:
    slot: int
    ids: list[int]
    first: int  # first labelled token (after the system prompt)
    turns: list[tuple[int, int]] = field(default_factory=list)  # assistant-turn token spans
    key: str = ""
    labels: list[int] = field(default_factory=list)  # the slot of each turn in `turns`

    def token_labels(self) -> list[int]:
        """The label of every token from `first` on: each turn's for its tokens and those before it (down to
        the previous turn's end), the last turn's after it; `slot` throughout when no turn is left."""
        if not self.turns:
            return [self.slot] * (len(self.ids) - self.first)
        out: list[int] = []
        for (_, e), lab in zip(self.turns, self.labels, strict=True):
            out += [lab] * max(0, e - self.first - len(out))
        return out + [self.labels[-1]] * (len(self.ids) - self.first - len(out))


def _ntok(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def build_examples(tok, transcripts: list[Transcript], max_length: int) -> list[Example]:
    """Tokenize with the model's training chat template; find each assistant turn's token span."""
    from trace_cli.models.chat import render

    out = []
    for t in transcripts:
        text = render(tok, t.messages, t.tools, add_generation_prompt=False)
        ids = tok(text, add_special_tokens=False)["input_ids"][:max_length]
        first = min(
            _ntok(tok, render(tok, t.messages[:1], t.tools, add_generation_prompt=False)), len(ids) - 1
        )
        turns, labels = [], []
        lab = iter(t.turn_labels())
        for i, m in enumerate(t.messages):
            if m.get("role") != "assistant":
                continue
            slot = next(lab)
            s = _ntok(tok, render(tok, t.messages[:i], t.tools, add_generation_prompt=True))
            e = min(
                _ntok(tok, render(tok, t.messages[: i + 1], t.tools, add_generation_prompt=False)), len(ids)
            )
            if s < e:
                turns.append((s, e))
                labels.append(slot)
        out.append(Example(t.slot, ids, max(first, 0), turns, t.key, labels))
    return out


def split(
    examples: list[Example], held_out: float, seed: int, at_least: int = 0
) -> tuple[list[Example], list[Example]]:
    """Stratified by slot, by episode key: a held-out conversation contributes no token to training. Each slot
    holds out its `held_out` share, or `at_least` conversations where that is more (at most half of them)."""
    rng = random.Random(seed)
    by_key: dict[str, list[Example]] = {}
    for e in examples:  # the same conversation twice stays on one side
        by_key.setdefault(e.key or str(id(e)), []).append(e)
    train, test = [], []
    for slot in sorted({g[0].slot for g in by_key.values()}):
        group = sorted((k for k, g in by_key.items() if g[0].slot == slot))
        rng.shuffle(group)
        n = max(1, round(len(group) * held_out), min(at_least, len(group) // 2)) if len(group) > 1 else 0
        test += [e for k in group[:n] for e in by_key[k]]
        train += [e for k in group[n:] for e in by_key[k]]
    return train, test


def _batch(examples: list[Example], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    labels = torch.full((len(examples), n), -100, dtype=torch.long)
    for i, e in enumerate(examples):  # right padding: positions stay those of an unpadded forward
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
        labels[i, e.first : len(e.ids)] = torch.tensor(e.token_labels(), dtype=torch.long)
    return ids.to(device), mask.to(device), labels.to(device)


def _decoder(model):
    """The decoder stack without the LM head: gate training needs no vocabulary logits."""
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    return dec if dec is not None else model


def train_gates(
    model,
    layers: dict[str, GatedLoraLinear],
    trace: RoutingTrace,
    examples: list[Example],
    *,
    n_slots: int,
    steps: int,
    lr: float,
    batch_size: int,
    aux_coef: float,
    seed: int,
    pad_id: int,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """AdamW on the gate weights only; class-balanced CE over every gate + aux_coef * load balancing."""
    if not examples:
        return []
    torch.manual_seed(seed)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    params = [layer.gate.weight for layer in layers.values()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    weight = _class_weights(examples, n_slots).to(device)
    by_slot: dict[int, list[Example]] = {}
    for e in examples:
        by_slot.setdefault(e.slot, []).append(e)
    slots = sorted(by_slot)
    dec = _decoder(model)
    model.train()
    rows = []
    t0 = time.monotonic()
    try:
        for step in range(1, steps + 1):
            # balanced batches: each slot in turn, so a rare expert is seen every step
            batch = [
                rng.choice(by_slot[slots[(step * batch_size + i) % len(slots)]]) for i in range(batch_size)
            ]
            ce, aux, acc = _gate_losses(dec, trace, _batch(batch, pad_id, device), n_slots, weight)
            loss = ce + aux_coef * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            row = {
                "step": step,
                "loss": float(loss.detach()),
                "ce": float(ce.detach()),
                "aux": float(aux.detach()),
                "token_accuracy": float(acc),
                "elapsed_s": time.monotonic() - t0,
            }
            rows.append(row)
            if log:
                log(row)
    finally:
        trace.clear()
        trace.collect_logits = False
        trace.mask = None
        model.eval()
    return rows


def _class_weights(examples: list[Example], n_slots: int) -> torch.Tensor:
    """Each slot's CE weight: inversely proportional to its routed tokens, so every present slot counts alike."""
    counts = torch.zeros(n_slots)
    for e in examples:
        counts += torch.bincount(torch.tensor(e.token_labels() or [e.slot]), minlength=n_slots).float()
    return torch.where(counts > 0, counts.sum() / (counts.clamp(min=1) * (counts > 0).sum()), torch.zeros(()))


def _gate_losses(dec, trace: RoutingTrace, batch, n_slots: int, weight: torch.Tensor):
    """One forward of a batch (ids, mask, labels): the class-weighted CE over every gate, the load-balancing aux
    loss, and the gates' token accuracy (no gradient)."""
    ids, mask, labels = batch
    trace.clear()
    trace.collect_logits = True
    trace.mask = mask.reshape(-1).bool()
    dec(input_ids=ids, attention_mask=mask, use_cache=False)
    flat = labels.reshape(-1)
    keep = flat != -100
    ce = torch.stack(
        [F.cross_entropy(lg.reshape(-1, n_slots)[keep], flat[keep], weight=weight) for lg in trace.logits]
    ).mean()
    aux = torch.stack(trace.aux).mean() if trace.aux else torch.zeros((), device=ids.device)
    with torch.no_grad():
        acc = torch.stack(
            [(lg.reshape(-1, n_slots)[keep].argmax(-1) == flat[keep]).float().mean() for lg in trace.logits]
        ).mean()
    return ce, aux, acc


@torch.no_grad()
def routing_accuracy(
    model,
    trace: RoutingTrace,
    examples: list[Example],
    *,
    n_slots: int,
    names: list[str],
    pad_id: int,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Per held-out assistant turn: is the most chosen slot (tokens x layers) the turn's label? Per slot: the
    accuracy, its turns, and the held-out conversations with a turn of it."""
    device = next(model.parameters()).device
    dec = _decoder(model)
    model.eval()
    tally = {"right": [0] * n_slots, "total": [0] * n_slots, "convs": [0] * n_slots, "tok": [0, 0]}
    trace.record = True
    try:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i : i + batch_size]
            ids, mask, _ = _batch(chunk, pad_id, device)
            trace.clear()
            dec(input_ids=ids, attention_mask=mask, use_cache=False)
            for row, e in enumerate(chunk):
                _score(tally, e, [turn_votes(trace.choices, row, s, t, n_slots) for s, t in e.turns])
    finally:
        trace.record = False
        trace.clear()
    right, total, (tok_right, tok_total) = tally["right"], tally["total"], tally["tok"]
    per = {names[s]: (round(right[s] / total[s], 4) if total[s] else None) for s in range(n_slots)}
    n = sum(total)
    return {
        "routing_accuracy": round(sum(right) / n, 4) if n else None,
        "routing_accuracy_per_expert": per,
        "routing_turns": n,
        "routing_turns_per_expert": {names[s]: total[s] for s in range(n_slots)},
        "routing_test_conversations": len(examples),
        "routing_test_conversations_per_expert": {names[s]: tally["convs"][s] for s in range(n_slots)},
        "token_routing_accuracy": round(tok_right / tok_total, 4) if tok_total else None,
    }


def _score(tally: dict[str, list[int]], e: Example, votes: list[torch.Tensor]) -> None:
    for lab, v in zip(e.labels, votes, strict=True):
        tally["total"][lab] += 1
        tally["right"][lab] += int(int(v.argmax()) == lab)
        tally["tok"][0] += int(v[lab])
        tally["tok"][1] += int(v.sum())
    for lab in set(e.labels):
        tally["convs"][lab] += 1
