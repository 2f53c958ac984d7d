"""Inference helpers of the mixture of LoRA experts (compose.moe): gated layers fed the same input share one
gate matmul and one A matmul (SiblingGates), and a single token (a batch-1 decode step on CPU) is routed on
the host so only the chosen experts' weights are applied."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

# the gated layers and their RoutingTrace are compose.moe's (which imports this module): typed Any here
GatedLoraLinear = RoutingTrace = Any


def _one_token(x3: torch.Tensor) -> bool:
    """A batch-1 decode step on CPU, where reading the gate's choice on the host costs no device sync."""
    return x3.shape[0] * x3.shape[1] == 1 and x3.device.type == "cpu" and _FAST[0]


_FAST = [True]  # tests switch the single-token path off to compare it with the batched one


def _top1(logits: torch.Tensor, members: int, n_slots: int) -> list[tuple[int, float]]:
    """(argmax slot, its softmax probability) per member, from one token's gate logits, on the host (first
    slot on ties, as torch's max)."""
    rows = logits.reshape(members, n_slots).tolist()
    out = []
    for row in rows:
        top = max(row)
        out.append((row.index(top), 1.0 / sum(math.exp(v - top) for v in row)))
    return out


# Layers one module feeds the same input tensor (attention q/k/v, the MLP's gate/up): at inference their gates
# and expert A's run as one matmul each.
SIBLINGS = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}, {"w1", "w3"}, {"query", "key", "value"})


class SiblingGates:
    """Inference for gated layers fed the same tensor: the first of them to see a new input computes every
    member's routing and A-projection (one gate matmul, one A matmul over all members' experts); each member
    then adds its own B. A member fed another tensor recomputes for it, so sharing is never assumed."""

    def __init__(self, members: list[GatedLoraLinear]):
        self.members = members
        self.name = members[0].layer_name  # the gate context is the first member's (same input, same values)
        self.n_slots = members[0].n_slots
        a_rows, member_of_row, slot_of_row = [], [], []
        self.span: dict[int, tuple[int, int]] = {}
        at = 0
        for i, m in enumerate(members):
            if m.lora_A_all is not None:
                r = m.lora_A_all.shape[0]
                a_rows.append(m.lora_A_all)
                member_of_row += [i] * r
                slot_of_row += m.rows_slot.tolist()
                self.span[id(m)] = (at, at + r)
                at += r
        dev = members[0].gate.weight.device
        self.a = torch.cat(a_rows) if a_rows else None
        self.member_of_row = torch.tensor(member_of_row, dtype=torch.long, device=dev)
        self.slot_of_row = torch.tensor(slot_of_row, dtype=torch.long, device=dev)
        self._w: tuple | None = None  # (key, weight, bias) of the stacked gates
        self._x: torch.Tensor | None = None
        self._h: torch.Tensor | None = None
        self._one: dict | None = None  # a single token's deltas: member id -> (A rows applied, B^T, weight)
        self._plans: dict[tuple, tuple] = {}  # (choices, device, dtype) -> _plan

    def _gates(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        gates = [m.gate for m in self.members]
        key = tuple((id(g.weight), g.weight._version, id(getattr(g, "bias", None))) for g in gates)
        if self._w is None or self._w[0] != key:
            w = torch.cat([g.weight for g in gates])
            biases = [getattr(g, "bias", None) for g in gates]
            b = None
            if any(x is not None for x in biases):
                b = torch.cat([x if x is not None else w.new_zeros(self.n_slots) for x in biases])
            self._w = (key, w, b)
        return self._w[1], self._w[2]

    def add_delta(
        self, layer: GatedLoraLinear, x3: torch.Tensor, trace: RoutingTrace, y: torch.Tensor
    ) -> torch.Tensor:
        """y (`layer`'s base output for x3) plus its chosen experts' deltas."""
        if self._x is not x3 or trace._shared is None or trace._shared[0] is not self._x:
            self._compute(x3, trace)
        if self._one is not None:  # one token: only the chosen experts' A rows were applied
            d = self._one.get(id(layer))
            if d is None:
                return y
            h, bt, p = d
            return torch.addmm(y.view(1, -1), h, bt, alpha=p).view_as(y)
        if self._h is None or id(layer) not in self.span:
            return y
        lo, hi = self.span[id(layer)]
        return y + F.linear(self._h[..., lo:hi], layer.lora_B_all).view_as(y)

    def _compute_one(self, x3: torch.Tensor, logits: torch.Tensor, trace: RoutingTrace) -> None:
        """A single token (a batch-1 decode step on CPU): the top-1 choices read on the host, then one matmul
        with the chosen experts' A rows stacked (none when every member chose the base) and, per member,
        one addmm with its chosen B (the same sum as the batched path, without the unchosen experts)."""
        top = _top1(logits, len(self.members), self.n_slots)
        if trace.record:
            for m, (e, _) in zip(self.members, top, strict=True):
                trace.choices.append((m.layer_name, torch.tensor([[e]], device=x3.device)))
        key = (tuple(e for e, _ in top), x3.device, x3.dtype)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(key[0])
        a, parts = plan
        h = F.linear(x3.view(1, -1), a) if a is not None else None
        self._one = {mid: (h[:, lo:hi], bt, top[i][1]) for i, mid, lo, hi, bt in parts}

    def _plan(self, choice: tuple[int, ...]) -> tuple:
        """For the members' choices: their chosen A's stacked, and per member (index, id, rows, B transposed)."""
        a_rows, parts, at = [], [], 0
        for i, (m, e) in enumerate(zip(self.members, choice, strict=True)):
            if e and m._has[e]:
                a = getattr(m, f"lora_A_{e}")
                a_rows.append(a)
                parts.append((i, id(m), at, at + a.shape[0], getattr(m, f"lora_B_{e}").t()))
                at += a.shape[0]
        return (torch.cat(a_rows) if a_rows else None), parts

    def _compute(self, x3: torch.Tensor, trace: RoutingTrace) -> None:
        w, b = self._gates()
        if self.a is not None and self.a.device != x3.device:  # the model moved after attach
            self.a = self.a.to(x3.device)
            self.member_of_row = self.member_of_row.to(x3.device)
            self.slot_of_row = self.slot_of_row.to(x3.device)
        gx = x3 if x3.dtype == w.dtype else x3.to(w.dtype)
        logits = F.linear(trace.gate_input(self.name, gx), w, b)
        self._x = x3
        if _one_token(x3):
            self._compute_one(x3, logits, trace)
            return
        self._one = None
        probs = logits.view(*logits.shape[:-1], len(self.members), self.n_slots).softmax(-1)
        p, idx = probs.max(-1)  # (B, T, members)
        if trace.record:
            lead = x3.shape[:-1]
            for i, m in enumerate(self.members):
                trace.choices.append((m.layer_name, idx[..., i].reshape(lead)))
        if self.a is None:
            self._h = None
            return
        sel = idx.index_select(-1, self.member_of_row) == self.slot_of_row
        coef = sel * p.index_select(-1, self.member_of_row).to(x3.dtype)
        self._h = F.linear(x3, self.a) * coef
