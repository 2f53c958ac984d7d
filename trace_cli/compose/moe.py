"""Token-level top-1 mixture of LoRA experts (ours, beyond the paper).

Every linear layer that some adapter adapts becomes a `GatedLoraLinear`: the frozen base layer, the frozen
LoRA matrices of each expert, and a small trainable gate `Linear(in_features, 1 + n_experts)` that reads the
layer input. Per token the gate picks one slot by argmax (slot 0 = base, no adapter); the chosen expert's
LoRA delta is scaled by its gate probability (Switch Transformer), so the gate gets a gradient through the
output as well as from its routing loss; a Switch load-balancing loss is available for training.

Training computes only the chosen expert's delta, tokens grouped by expert. Inference (no gradient) applies
the experts batched, with no per-expert Python work and no host sync: one matmul with every expert's A
stacked, the rows of the experts a token did not choose zeroed by its gate weight, one matmul with the B's
stacked (the same sum: unchosen experts add exactly zero). Layers fed the same input tensor (q/k/v, gate/up)
share its gate context and gate input, and a decode step (one new token) updates the context in O(1); a
prefill scans the context under the gates' context columns (the average is linear: a few columns, not d).
A batch-1 decode step on CPU runs each such group as one matmul (moe_infer.FusedStep: base weights, every
expert's A and the gates stacked), reads the choices on the host and applies only the chosen B's.
Routing is per token, so KV-cached generation works unchanged (each new token is routed when computed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trace_cli.compose.adapters import LoraWeights

# the gates file: stages.compose and compose.policy read and write it through this module
from trace_cli.compose.gate_files import (
    GATES_FORMAT,
    check_gates,
    gate_tensors,
    load_gates,
    read_gates,
    save_gates,
)
from trace_cli.compose.moe_infer import _FAST, SIBLINGS, FusedStep, SiblingGates


@dataclass
class RoutingTrace:
    """State shared by the gated layers of one model: what to collect during a forward pass."""

    collect_logits: bool = False  # training: every layer's gate logits, in call order
    record: bool = False  # evaluation/tests: every layer's top-1 choices, in call order
    mask: torch.Tensor | None = None  # flat bool mask of real tokens for the load-balancing loss
    context: bool = True  # gates also read a moving average of their layer's input over the sequence
    horizon: float = 64.0  # tokens: the moving average's time constant
    pad_id: int | None = None
    fresh: bool = True  # the current forward starts a new sequence (no KV cache before it)
    new_mask: torch.Tensor | None = None  # (B, T) 1 for the current forward's real tokens, 0 for padding
    state: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # layer -> (sum, count)
    _shared: tuple[torch.Tensor, str, torch.Tensor] | None = None
    _shared_scan: tuple | None = None  # gate_logits: (input, state before it, layer) of the last prefill scan
    _apow: dict[str, torch.Tensor] = field(default_factory=dict)  # decode steps: a**count per layer
    forwards: int = 0  # forward passes begun (a FusedStep's results are this forward's)
    unsettled: dict[int, Any] = field(default_factory=dict)  # FusedSteps whose context `state` lags (settle)
    logits: list[torch.Tensor] = field(default_factory=list)
    aux: list[torch.Tensor] = field(default_factory=list)
    choices: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def clear(self) -> None:
        self.logits, self.aux, self.choices = [], [], []

    def before_forward(self, module, args, kwargs) -> None:
        """Decoder pre-hook: is this a new sequence or a cached continuation, and which new tokens are real."""
        self.forwards += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        emb = kwargs.get("inputs_embeds")
        past = kwargs.get("past_key_values")
        self.fresh = past is None or past.get_seq_length() == 0
        ref = ids if ids is not None else emb
        n = ref.shape[1]
        am = kwargs.get("attention_mask")
        if isinstance(am, torch.Tensor) and am.dim() == 2:
            self.new_mask = am[:, -n:]
        elif ids is not None and self.fresh and self.pad_id is not None:
            self.new_mask = (ids != self.pad_id).long()  # masks already expanded by the caller: pads by id
        else:
            self.new_mask = None
        if self.fresh:
            self.state = {}
            self.unsettled = {}
        elif self.unsettled and ref.shape[0] * n != 1:
            self.settle()  # not a batch-1 decode step: the context is read from `state`
        self._shared = (
            None  # (input, gate input) of the last gated layer: layers fed the same tensor share it
        )
        self._shared_scan = None
        if n != 1:
            self._apow = {}  # only decode steps keep it (context_mean's updates do not)

    def settle(self) -> None:
        """Write the gate context that batch-1 decode steps (FusedStep) keep pending into `state`."""
        for step in list(self.unsettled.values()):
            step.settle(self)

    # A server's running batch gains and loses rows between tokens (serve.engine): the gates' running context
    # is per row, so it follows the rows.
    def take_rows(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The running context of every row (and none is left): before new rows are prefilled."""
        self.settle()
        state, self.state = self.state, {}
        self._apow = {}
        return state

    def join_rows(self, before: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Rows whose context is `before` (take_rows) come first, the rows just prefilled after them."""
        self.settle()
        new = self.state
        self.state = {
            k: (torch.cat([before[k][0], new[k][0]]), torch.cat([before[k][1], new[k][1]]))
            for k in new
            if k in before
        }

    def select_rows(self, idx: torch.Tensor) -> None:
        self.settle()
        self._apow = {}
        self.state = {
            k: (e.index_select(0, idx.to(e.device)), c.index_select(0, idx.to(c.device)))
            for k, (e, c) in self.state.items()
        }

    def gate_input(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Inference: [x, context_mean(x)] for a (B, T, d) input; a layer fed the very tensor the previous gated
        layer was fed (q/k/v, gate/up) shares its result and its context state (the same values)."""
        sh = self._shared
        if sh is not None and sh[0] is x:
            if self.context:
                self.state[name] = self.state[sh[1]]
                if sh[1] in self._apow:
                    self._apow[name] = self._apow[sh[1]]
            return sh[2]
        if not self.context:
            g = x
        elif x.shape[1] == 1:
            g = torch.cat([x, self._context_step(name, x)], -1)
        else:
            g = torch.cat([x, self.context_mean(name, x)], -1)
        self._shared = (x, name, g)
        return g

    def _context_step(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """context_mean for one new token per row (a decode step) as an O(1) update of the moving average. A
        decode step's new token is real in every row (generation extends the attention mask with ones), so
        the mask is not read; a[name] keeps a**count, the bias correction, so no power is taken per step."""
        a = 1.0 - 1.0 / self.horizon
        prev = None if self.fresh else self.state.get(name)
        xt = x[:, 0]
        if prev is not None and prev[0].shape[0] == x.shape[0]:
            e = torch.lerp(prev[0], xt, 1.0 - a)
            cnt = prev[1] + 1
            apow = self._apow.get(name)
            apow = apow * a if apow is not None and apow.shape[0] == x.shape[0] else a**cnt
        else:
            e = xt * (1.0 - a)
            cnt = torch.ones(x.shape[0], 1, device=x.device, dtype=x.dtype)
            apow = cnt * a
        self.state[name] = (e, cnt)
        self._apow[name] = apow
        return (e / (1.0 - apow)).unsqueeze(1)

    def context_mean(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Exponential moving average of x over the sequence's real tokens so far (x: B, T, d), horizon
        `horizon` tokens, bias-corrected; carried across KV-cached steps. Recent tokens dominate, so the
        context follows the conversation when it moves to another task."""
        out, self.state[name] = self._scan(x, None, None if self.fresh else self.state.get(name))
        return out

    def gate_logits(
        self, name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
    ) -> torch.Tensor:
        """Inference: gates `w` (rows: slots; columns: x, then its context) applied to gate_input(name, x). A
        prefill takes the context's image under the context half of `w` (the average is linear): the scan
        runs over the gates' few columns instead of the input's d; a layer fed the tensor the last one was
        scans it from the same state (and shares the state after it)."""
        if not self.context or x.shape[1] == 1:
            return F.linear(self.gate_input(name, x), w, b)
        d, sh = x.shape[-1], self._shared_scan
        if sh is not None and sh[0] is x:
            ctx, _ = self._scan(x, w[:, d:], sh[1])
            self.state[name] = self.state[sh[2]]
        else:
            prev = None if self.fresh else self.state.get(name)
            ctx, self.state[name] = self._scan(x, w[:, d:], prev)
            self._shared_scan = (x, prev, name)
        out = torch.addmm(ctx.reshape(-1, ctx.shape[-1]), x.reshape(-1, d), w[:, :d].t()).view_as(ctx)
        return out if b is None else out + b

    def _scan(self, x: torch.Tensor, w: torch.Tensor | None, prev) -> tuple[torch.Tensor, tuple]:
        """(the bias-corrected moving average after each token of x, under `w` when given, and the state
        (average of x, count) after the last token), from the state before x (`prev`, or none)."""
        a = 1.0 - 1.0 / self.horizon
        m = self.new_mask
        m = torch.ones(x.shape[:2], device=x.device, dtype=x.dtype) if m is None else m.to(x.device, x.dtype)
        bsz, n, d = x.shape
        if prev is not None and prev[0].shape[0] == bsz:
            ema, cnt = prev
        else:
            ema, cnt = x.new_zeros(bsz, d), x.new_zeros(bsz, 1)
        xm = x * m.unsqueeze(-1)
        ym, img = (xm, ema) if w is None else (F.linear(xm, w), F.linear(ema, w))
        out = []
        chunk = _CHUNK if w is None else 4 * _CHUNK  # the image has a few columns: bigger chunks, fewer steps
        for c0 in range(0, n, chunk):  # exact chunked scan: a (C x C) decay matrix per chunk
            yc, mc = ym[:, c0 : c0 + chunk], m[:, c0 : c0 + chunk]
            decay, carry = _decay(yc.shape[1], a, x.device, x.dtype)
            e = (1 - a) * torch.matmul(decay, yc) + carry.view(1, -1, 1) * img.unsqueeze(1)
            cn = cnt + mc.cumsum(1)
            out.append(e / (1 - a ** cn.unsqueeze(-1)).clamp(min=1e-6))
            if w is not None:  # the average itself, at the chunk's last token
                xc = xm[:, c0 : c0 + chunk]
                ema = (1 - a) * torch.matmul(decay[-1], xc) + carry[-1] * ema
            img, cnt = e[:, -1], cn[:, -1:]
            ema = img if w is None else ema
        return torch.cat(out, 1), (ema.detach(), cnt.detach())


_DECAYS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _decay(k: int, a: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan's (k x k) decay matrix (a**(i-j) on and below the diagonal) and carry a**(i+1), made once."""
    key = (k, a, str(device), dtype)
    if key not in _DECAYS:
        steps = torch.arange(k, device=device, dtype=dtype)
        decay = torch.tril(a ** (steps.view(-1, 1) - steps.view(1, -1)).clamp(min=0))
        decay = decay * torch.tril(torch.ones(k, k, device=device, dtype=dtype))
        if len(_DECAYS) >= 8:  # up to 1 MiB each (512 x 512): a prompt's last chunk has any length
            _DECAYS.pop(next(iter(_DECAYS)))
        _DECAYS[key] = (decay, a ** (steps + 1))
    return _DECAYS[key]


_CHUNK = 128


class GatedLoraLinear(nn.Module):
    """y = W x + p_e * s_e B_e A_e x with e = argmax gate(x) per token (no delta when e = 0, the base)."""

    def __init__(self, base: nn.Linear, name: str, experts: list[LoraWeights], trace: RoutingTrace):
        super().__init__()
        self.base_layer = base
        self.layer_name = name
        self.in_features, self.out_features = base.in_features, base.out_features
        self.n_slots = 1 + len(experts)
        self.gate = nn.Linear(self.in_features * (2 if trace.context else 1), self.n_slots, bias=False)
        nn.init.zeros_(self.gate.weight)  # untrained: uniform probabilities, argmax = slot 0 = base
        self._trace = [trace]  # a list: not a submodule
        self._has: list[bool] = [False]
        dev, dt = base.weight.device, base.weight.dtype
        rows_slot: list[int] = []
        a_all, b_all = [], []
        for i, e in enumerate(experts, start=1):
            ab = e.modules.get(name)
            self._has.append(ab is not None)
            if ab is not None:
                a, b = ab
                self.register_buffer(f"lora_A_{i}", a.to(dev, dt), persistent=False)
                # the scaling is folded into B once, so a token's delta is B'(A x) * p
                self.register_buffer(f"lora_B_{i}", (b * e.scaling).to(dev, dt), persistent=False)
                a_all.append(getattr(self, f"lora_A_{i}"))
                b_all.append(getattr(self, f"lora_B_{i}"))
                rows_slot += [i] * a.shape[0]
        # inference: every expert at once (A's stacked by rows, B's by columns; row r belongs to slot rows_slot[r])
        self.register_buffer("lora_A_all", torch.cat(a_all) if a_all else None, persistent=False)
        self.register_buffer("lora_B_all", torch.cat(b_all, 1) if b_all else None, persistent=False)
        self.register_buffer(
            "rows_slot", torch.tensor(rows_slot, dtype=torch.long, device=dev), persistent=False
        )
        self._group: list[SiblingGates] | None = None  # layers fed the same input (a list: not a submodule)
        self._step: list[FusedStep] | None = None  # decode steps of this layer and its siblings

    @property
    def trace(self) -> RoutingTrace:
        return self._trace[0]

    def _delta(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, getattr(self, f"lora_A_{slot}")), getattr(self, f"lora_B_{slot}"))

    def _infer(self, x: torch.Tensor, trace: RoutingTrace) -> torch.Tensor:
        """forward without gradients: the same routing and output, experts applied batched (module doc)."""
        x3 = x if x.dim() == 3 else x.reshape(1, -1, x.shape[-1])
        base = self.base_layer
        y = F.linear(x, base.weight, base.bias) if type(base) is nn.Linear else base(x)
        w = self.gate.weight
        if self._group is not None:
            return self._group[0].add_delta(self, x3, trace, y)
        gx = x3 if x3.dtype == w.dtype else x3.to(w.dtype)
        logits = trace.gate_logits(self.layer_name, gx, w, self.gate.bias)
        p, idx = logits.softmax(-1).max(-1)
        if trace.record:
            trace.choices.append((self.layer_name, idx.reshape(x.shape[:-1]).detach()))
        if self.lora_A_all is None:
            return y
        # each A row scaled by the gate weight when its expert is the token's choice, else by 0
        coef = (idx.unsqueeze(-1) == self.rows_slot) * p.unsqueeze(-1).to(y.dtype)
        h = F.linear(x3, self.lora_A_all) * coef
        return y + F.linear(h, self.lora_B_all).view_as(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trace = self._trace[0]
        if not self.training and not trace.collect_logits and not torch.is_grad_enabled():
            # a batch-1 decode step on CPU: one matmul per group of layers fed the same input (FusedStep)
            if self._step is not None and x.is_cpu and x.numel() == self.in_features and _FAST[0]:
                y = self._step[0].output(self, x, trace)
                if y is not None:
                    return y
            if trace.unsettled:
                trace.settle()
            return self._infer(x, trace)
        y = self.base_layer(x)
        gx = (x.detach() if self.training else x).to(self.gate.weight.dtype)
        if trace.context:
            g3 = gx if gx.dim() == 3 else gx.reshape(1, -1, gx.shape[-1])
            gx = torch.cat([g3, trace.context_mean(self.layer_name, g3)], -1).reshape(*gx.shape[:-1], -1)
        logits = self.gate(gx)
        probs = logits.softmax(-1)
        p, idx = probs.max(-1)
        if trace.collect_logits:
            trace.logits.append(logits)
            flat = probs.reshape(-1, self.n_slots)
            f = F.one_hot(idx.reshape(-1), self.n_slots).to(flat.dtype)
            if trace.mask is not None and trace.mask.numel() == flat.shape[0]:
                f, flat = f[trace.mask], flat[trace.mask]
            trace.aux.append(self.n_slots * (f.mean(0) * flat.mean(0)).sum())  # Switch load balancing
        if trace.record:
            trace.choices.append((self.layer_name, idx.detach()))
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.in_features)
        idf = idx.reshape(-1)
        pf = p.reshape(-1, 1).to(y.dtype)
        slots = [s for s in torch.unique(idf).tolist() if s and self._has[s]]
        if not slots:
            return y
        if len(slots) == 1 and bool((idf == slots[0]).all()):
            # every token chose the same expert (the usual decode step): no gather/scatter
            return y + (self._delta(slots[0], xf) * pf).view(*lead, self.out_features)
        delta = torch.zeros(xf.shape[0], self.out_features, dtype=y.dtype, device=y.device)
        for s in slots:
            rows = (idf == s).nonzero().squeeze(1)
            delta = delta.index_add(
                0, rows, self._delta(s, xf.index_select(0, rows)) * pf.index_select(0, rows)
            )
        return y + delta.view(*lead, self.out_features)


def attach(
    model,
    experts: list[LoraWeights],
    targets: list[str],
    *,
    context: bool = True,
    horizon: float = 64.0,
    pad_id: int | None = None,
) -> tuple[dict[str, GatedLoraLinear], RoutingTrace]:
    """Replace each target linear of `model` by a GatedLoraLinear; freeze everything but the gates."""
    trace = RoutingTrace(context=context, horizon=horizon, pad_id=pad_id)
    layers: dict[str, GatedLoraLinear] = {}
    mods = dict(model.named_modules())
    for p in model.parameters():
        p.requires_grad_(False)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = mods[parent_name] if parent_name else model
        layer = GatedLoraLinear(getattr(parent, child), name, experts, trace)
        setattr(parent, child, layer)
        layers[name] = layer
    for layer in layers.values():
        layer.gate.weight.requires_grad_(True)
    groups: dict[tuple[str, int], list[GatedLoraLinear]] = {}
    for name, layer in layers.items():
        parent_name, _, child = name.rpartition(".")
        kind = next((i for i, sib in enumerate(SIBLINGS) if child in sib), None)
        if kind is not None:
            groups.setdefault((parent_name, kind), []).append(layer)
    order = {n: i for i, n in enumerate(mods)}  # the model's own order: the order its forward calls them
    # a base weight another module shares (tied) is not rebound to a view of a FusedStep's stack
    own = {id(m.base_layer.weight) for m in layers.values()}
    tied = {p.data_ptr() for p in model.parameters() if id(p) not in own}
    alone = [[m] for m in layers.values()]
    for members in [*groups.values(), *alone]:
        members.sort(key=lambda m: order.get(m.layer_name, 0))
        if len(members) > 1 and len({m.in_features for m in members}) == 1:
            shared = [SiblingGates(members)]
            for m in members:
                m._group = shared
        if members[0]._step is None and (len(members) == 1 or members[0]._group is not None):
            rebind = not any(m.base_layer.weight.data_ptr() in tied for m in members)
            step = [FusedStep(members, rebind)]
            for m in members:
                m._step = step
    get = getattr(model, "get_decoder", None)
    decoder = (get() if callable(get) else None) or model
    decoder.register_forward_pre_hook(trace.before_forward, with_kwargs=True)
    return layers, trace


def turn_votes(
    choices: list[tuple[str, torch.Tensor]], row: int, start: int, end: int, n_slots: int
) -> torch.Tensor:
    """Votes per slot over tokens [start, end) of batch row `row`, summed over every gated layer."""
    votes = torch.zeros(n_slots, dtype=torch.long)
    for _, idx in choices:
        seg = idx[row, start:end].reshape(-1).cpu()
        votes += torch.bincount(seg, minlength=n_slots)
    return votes


__all__ = [
    "GATES_FORMAT",
    "GatedLoraLinear",
    "RoutingTrace",
    "SiblingGates",
    "attach",
    "check_gates",
    "gate_tensors",
    "load_gates",
    "read_gates",
    "save_gates",
    "turn_votes",
]
