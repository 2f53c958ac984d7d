"""The file a MoE composition's trained gates live in (safetensors, one `NAME.gate.weight` per gated layer)
and the checks that gates fit: the same base model (by digest) and the same experts in the same order.
`layers`: the composition's gated layers by name (compose.moe.GatedLoraLinear: each has its `gate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trace_cli.errors import UsageError

GATES_FORMAT = "trace-moe-gates-v1"


def gate_tensors(layers: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        f"{n}.gate.weight": layer.gate.weight.detach().float().cpu().contiguous()
        for n, layer in layers.items()
    }


def save_gates(path: Path, layers: dict[str, Any], *, base_digest: str, experts: list[str]) -> None:
    from safetensors.torch import save_file

    meta = {"format": GATES_FORMAT, "base_digest": base_digest, "experts": json.dumps(experts)}
    save_file(gate_tensors(layers), str(path), metadata=meta)


def read_gates(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    if meta.get("format") != GATES_FORMAT:
        raise UsageError(f"{path}: not a trace MoE gates file (format {meta.get('format')!r})")
    meta["experts"] = json.loads(meta.get("experts", "[]"))
    return tensors, meta


def check_gates(meta: dict[str, Any], *, base_digest: str, experts: list[str], origin: str) -> None:
    """UsageError (exit 2) unless gates with metadata `meta` (read_gates) were trained on this base model for
    these experts, in this order: gates only fit the base and experts they were trained with."""
    if meta.get("base_digest") != base_digest:
        raise UsageError(
            f"gates from {origin} were trained on another base model (digest {str(meta.get('base_digest'))[:12]}…, "
            f"this base is {base_digest[:12]}…); gates only fit the base they were trained on",
            hint="train new gates (drop moe.gates) or use that base",
        )
    if meta.get("experts") != experts:
        raise UsageError(
            f"gates from {origin} route experts {meta.get('experts')}, this composition has {experts}; "
            "the experts and their order must match"
        )


def load_gates(
    layers: dict[str, Any], path: Path, *, base_digest: str, experts: list[str], origin: str
) -> None:
    """Load trained gates; UsageError if they were trained on another base model or other experts."""
    tensors, meta = read_gates(path)
    check_gates(meta, base_digest=base_digest, experts=experts, origin=origin)
    want = set(gate_tensors(layers))
    if set(tensors) != want:
        missing = sorted(want - set(tensors))[:3]
        extra = sorted(set(tensors) - want)[:3]
        raise UsageError(
            f"gates from {origin} do not fit this model's layers (missing {missing}, unexpected {extra})"
        )
    for n, layer in layers.items():
        t = tensors[f"{n}.gate.weight"]
        if tuple(t.shape) != tuple(layer.gate.weight.shape):
            raise UsageError(
                f"gates from {origin}: {n} has shape {tuple(t.shape)}, this model needs "
                f"{tuple(layer.gate.weight.shape)} (another base?)"
            )
        with torch.no_grad():
            layer.gate.weight.copy_(t.to(layer.gate.weight.device, layer.gate.weight.dtype))
