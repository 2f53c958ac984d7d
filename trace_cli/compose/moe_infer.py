"""Inference helpers of the mixture of LoRA experts (compose.moe): gated layers fed the same input share one
gate matmul and one A matmul (SiblingGates), and a single token (a batch-1 decode step on CPU) runs as one
matmul per group of such layers, routed on the host, with only the chosen experts' B applied (FusedStep)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

# the gated layers and their RoutingTrace are compose.moe's (which imports this module): typed Any here
GatedLoraLinear = RoutingTrace = Any


PENDING = 64  # FusedStep: decode steps whose gate-context average waits to be written, at most
# a batch-1 decode step on CPU (where reading the gates' choices on the host costs no device sync) runs as a
# FusedStep; tests switch that path off to compare it with the batched one
_FAST = [True]


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
        self._forward = -1  # the trace's forward count when _x was computed
        self._h: torch.Tensor | None = None

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
        if self._x is not x3 or self._forward != trace.forwards:
            self._compute(x3, trace)
        if self._h is None or id(layer) not in self.span:
            return y
        lo, hi = self.span[id(layer)]
        return y + F.linear(self._h[..., lo:hi], layer.lora_B_all).view_as(y)

    def _compute(self, x3: torch.Tensor, trace: RoutingTrace) -> None:
        w, b = self._gates()
        if self.a is not None and self.a.device != x3.device:  # the model moved after attach
            self.a = self.a.to(x3.device)
            self.member_of_row = self.member_of_row.to(x3.device)
            self.slot_of_row = self.slot_of_row.to(x3.device)
        gx = x3 if x3.dtype == w.dtype else x3.to(w.dtype)
        logits = trace.gate_logits(self.name, gx, w, b)
        self._x, self._forward = x3, trace.forwards
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


class FusedStep:
    """A batch-1 decode step on CPU for the gated layers fed one input (siblings, or a layer alone): a single
    matmul with the members' base weights, every expert's A and the gates stacked (the base weights become
    views of the stack: no second copy), the gates' choices read on the host, then per member at most one
    addmm with its chosen expert's B. The gate context stays a running average in gate-logit space: the
    average is linear, so the gates' context half applied to it updates from that half applied to the new
    token (rows of the same matmul); the average itself is still kept in the trace for the other paths."""

    def __init__(self, members: list[GatedLoraLinear], rebind: bool = True):
        self.members, self.name, self.rebind = members, members[0].layer_name, rebind
        self.n_slots = members[0].n_slots
        self.ok = False
        self._watch: list[tuple] = []  # what the stack was built from (rebuilt when any of it changes)
        self._x: torch.Tensor | None = None
        self._forward = -1
        self._out: dict[int, torch.Tensor] = {}
        # the gate context: the running average in the trace's state (or None) and the tokens since, the
        # gates' context half applied to the average after them, a**count and the count
        self._e0: torch.Tensor | None = None
        self._xs: list[torch.Tensor] = []
        self._s: list[float] = []
        self._apow = 1.0
        self._count = 0.0

    def _stale(self) -> bool:
        if not self._watch:
            return True
        for mods, gate, gw, gv, b, bv, base, ptr, v in self._watch:
            if (
                mods["gate"] is not gate
                or gate.weight is not gw
                or gw._version != gv
                or base.data_ptr() != ptr
            ):
                return True
            if base._version != v or (b is not None and (gate.bias is not b or b._version != bv)):
                return True
        return False

    def _build(self, context: bool) -> None:
        """The stacked weights and bias, and where each part's rows are."""
        ms = self.members
        dt = ms[0].base_layer.weight.dtype
        self.ok = all(type(m.base_layer) is torch.nn.Linear and dt == m.gate.weight.dtype for m in ms)
        self.ok = self.ok and all(m.base_layer.weight.dtype == dt for m in ms)
        if self.ok:
            self._stack(context)
        self._watch = [
            (m._modules, m.gate, m.gate.weight, m.gate.weight._version, getattr(m.gate, "bias", None))
            + (getattr(getattr(m.gate, "bias", None), "_version", None), m.base_layer.weight)
            + (m.base_layer.weight.data_ptr(), m.base_layer.weight._version)
            for m in ms
        ]

    def _stack(self, context: bool) -> None:
        parts, biases, at = [], [], 0
        self.base_rows, self.a_rows, self.bt = [], {}, {}
        for m in self.members:
            parts.append(m.base_layer.weight.detach())
            biases.append(m.base_layer.bias)
            self.base_rows.append((at, at + m.out_features))
            at += m.out_features
        for i, m in enumerate(self.members):
            for e in range(1, self.n_slots):
                if m._has[e]:
                    a = getattr(m, f"lora_A_{e}")
                    parts.append(a)
                    biases.append(None)
                    self.a_rows[i, e] = len(parts) - 1  # its part of the split output
                    # B transposed, contiguous: baddbmm reads it row by row (a strided B copies first)
                    self.bt[i, e] = getattr(m, f"lora_B_{e}").t().contiguous().unsqueeze(0)
                    at += a.shape[0]
        d, k = self.members[0].in_features, self.n_slots * len(self.members)
        halves = [slice(0, d)] + ([slice(d, 2 * d)] if context else [])
        for half in halves:  # the gates' input half, then their context half
            for m in self.members:
                parts.append(m.gate.weight.detach()[:, half])
                biases.append(None)
        # the gates' biases are added on the host (their logits are read there): no bias in the matmul for them
        gb = [getattr(m.gate, "bias", None) for m in self.members]
        self.gate_bias = None
        if any(b is not None for b in gb):
            self.gate_bias = [v for b in gb for v in (b.tolist() if b is not None else [0.0] * self.n_slots)]
        self.sizes = [p.shape[0] for p in parts[: len(parts) - len(halves) * len(self.members)]]
        self.sizes.append(k * len(halves))  # the gates' logits: one part
        w = torch.cat(parts)
        self.w_ctx = w[at + k : at + 2 * k] if context else None
        self.b = None
        if any(b is not None for b in biases):
            rows = [p.shape[0] for p in parts]
            self.b = torch.cat(
                [w.new_zeros(r) if b is None else b.detach() for b, r in zip(biases, rows, strict=True)]
            )
        if self.rebind:
            for m, (lo, hi) in zip(self.members, self.base_rows, strict=True):
                m.base_layer.weight.data = w[lo:hi]
        self.w = w
        self.plan = [(i, id(m), m._has, m.layer_name) for i, m in enumerate(self.members)]

    def output(self, layer: GatedLoraLinear, x: torch.Tensor, trace: RoutingTrace) -> torch.Tensor | None:
        """`layer`'s output for the token x (one_token, [1, 1, d]), or None where this path does not apply."""
        if self._x is not x or self._forward != trace.forwards:
            # checked at a sequence's first step (weights or gates do not change between decode steps)
            if (not self._watch or self._forward != trace.forwards - 1) and self._stale():
                self._build(trace.context)
            if not self.ok or x.dtype != self.w.dtype or x.dim() != 3:
                return None
            self._step(x, trace)
        return self._out[id(layer)]

    def _step(self, x: torch.Tensor, trace: RoutingTrace) -> None:
        parts = F.linear(x, self.w, self.b).split_with_sizes(self.sizes, -1)  # views: no copy
        g = parts[-1].tolist()[0][0]
        n, k = self.n_slots, self.n_slots * len(self.members)
        logits = g[:k]
        if self.gate_bias is not None:
            logits = [v + b for v, b in zip(logits, self.gate_bias, strict=True)]
        if trace.context:
            logits = [v + c for v, c in zip(logits, self._context(x, g[k:], trace), strict=True)]
        self._x, self._forward, out, exp = x, trace.forwards, {}, math.exp
        for i, key, has, name in self.plan:
            row = logits[i * n : (i + 1) * n]
            top = max(row)
            e = row.index(top)  # torch's max: the first slot on ties
            if trace.record:
                trace.choices.append((name, torch.tensor([[e]], device=x.device)))
            if e and has[e]:
                p = 1.0 / sum(exp(v - top) for v in row)  # its softmax probability
                out[key] = torch.baddbmm(parts[i], parts[self.a_rows[i, e]], self.bt[i, e], alpha=p)
            else:
                out[key] = parts[i]
        self._out = out

    def _context(self, x: torch.Tensor, u_ctx: list[float], trace: RoutingTrace) -> list[float]:
        """The gates' context half applied to the bias-corrected running average after this token (as
        RoutingTrace._context_step), from its image before (`_s`) and the half applied to the token (u_ctx).
        The average itself is written into the trace's state only when another path needs it (`settle`):
        until then the tokens since are kept (at most PENDING)."""
        a = 1.0 - 1.0 / trace.horizon
        prev = None if trace.fresh else trace.state.get(self.name)
        if prev is None or prev[0].shape[0] != 1:  # a new sequence
            self._e0, self._xs, s_prev, apow, count = None, [], [0.0] * len(u_ctx), 1.0, 0.0
        elif prev[0] is self._e0 and id(self) in trace.unsettled:  # continued: image and count known
            s_prev, apow, count = self._s, self._apow, self._count
        else:  # an average from a prefill (or rows that moved): its image, once
            self._e0, self._xs = prev[0], []
            s_prev = F.linear(prev[0], self.w_ctx).view(-1).tolist()
            count = float(prev[1].reshape(-1)[0])
            apow = a**count
        trace.unsettled[id(self)] = self
        self._xs.append(x)
        self._s = [a * sp + (1.0 - a) * v for sp, v in zip(s_prev, u_ctx, strict=True)]
        self._apow, self._count = apow * a, count + 1.0
        if len(self._xs) >= PENDING:
            self.settle(trace)
        return [v / (1.0 - self._apow) for v in self._s]

    def settle(self, trace: RoutingTrace) -> None:
        """Write the running average after the pending tokens into the trace's state (as the other paths
        keep it: ema, count)."""
        a = 1.0 - 1.0 / trace.horizon
        n, xs = len(self._xs), torch.cat(self._xs).view(len(self._xs), -1)
        w = torch.tensor([(1.0 - a) * a ** (n - 1 - j) for j in range(n)], dtype=xs.dtype)
        e = w @ xs
        e = (e if self._e0 is None else torch.add(e, self._e0[0], alpha=a**n)).unsqueeze(0)
        cnt = torch.full((1, 1), self._count, dtype=xs.dtype)
        # the group's context is its first member's (as SiblingGates keeps it)
        trace.state[self.name] = (e, cnt)
        trace._apow.pop(self.name, None)
        self._e0, self._xs = e, []
        trace.unsettled.pop(id(self), None)
