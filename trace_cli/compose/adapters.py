"""Read PEFT LoRA adapters as plain tensors (per target module: A, B, scaling) and describe their experts.

The router and the MoE apply LoRA deltas themselves (a weighted merge into W, or a per-token gated delta), so
they need the raw matrices, not a `PeftModel`. Only what both can apply exactly is accepted: plain LoRA on
`nn.Linear` layers, no DoRA, no per-module rank/alpha patterns, no bias.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.errors import UsageError

PEFT_PREFIX = "base_model.model."


@dataclass
class LoraWeights:
    """One adapter: module name (as in the base model) -> (A [r, in], B [out, r]); one scaling for all."""

    name: str
    scaling: float
    r: int
    modules: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def delta(self, module: str):
        """scaling * B @ A for one module (the dense weight update), or None if the adapter skips it."""
        ab = self.modules.get(module)
        if ab is None:
            return None
        a, b = ab
        return (b.float() @ a.float()) * self.scaling


def read_adapter_config(adapter_dir: Path) -> dict[str, Any]:
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        raise UsageError(f"{adapter_dir}: not a PEFT adapter directory (no adapter_config.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def load_lora(adapter_dir: Path, name: str) -> LoraWeights:
    """The adapter's LoRA matrices on CPU (float32); UsageError naming what is unsupported."""
    from safetensors.torch import load_file

    cfg = read_adapter_config(adapter_dir)
    why = []
    if cfg.get("peft_type", "LORA") != "LORA":
        why.append(f"peft_type {cfg.get('peft_type')} (only LORA)")
    if cfg.get("use_dora"):
        why.append("DoRA")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        why.append("per-module rank/alpha patterns")
    if cfg.get("bias", "none") != "none":
        why.append(f"bias={cfg.get('bias')}")
    if cfg.get("fan_in_fan_out"):
        why.append("fan_in_fan_out")
    if why:
        raise UsageError(f"adapter {name!r}: cannot compose an adapter with {', '.join(why)}")
    r = int(cfg["r"])
    alpha = float(cfg.get("lora_alpha", r))
    scaling = alpha / (r**0.5) if cfg.get("use_rslora") else alpha / r
    weights_file = Path(adapter_dir) / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise UsageError(f"adapter {name!r}: {weights_file} is missing")
    tensors = load_file(str(weights_file))
    out = LoraWeights(name, scaling, r)
    pairs: dict[str, dict[str, Any]] = {}
    for key, t in tensors.items():
        if not key.startswith(PEFT_PREFIX):
            raise UsageError(f"adapter {name!r}: unexpected tensor {key!r} (not a PEFT LoRA layout)")
        rest = key[len(PEFT_PREFIX) :]
        for part in ("lora_A", "lora_B"):
            tail = f".{part}.weight"
            if rest.endswith(tail):
                pairs.setdefault(rest[: -len(tail)], {})[part] = t.float()
                break
        else:
            raise UsageError(
                f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight of a linear layer "
                "(embedding LoRA, trainable modules_to_save and biases cannot be composed)"
            )
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise UsageError(f"adapter {name!r}: module {module} has only {', '.join(ab)}")
        out.modules[module] = (ab["lora_A"], ab["lora_B"])
    if not out.modules:
        raise UsageError(f"adapter {name!r}: no LoRA weights in {weights_file}")
    return out


def check_targets(model, experts: list[LoraWeights]) -> list[str]:
    """Every module the experts adapt, sorted; each must be an nn.Linear of `model` with matching shapes."""
    import torch.nn as nn

    mods = dict(model.named_modules())
    names: set[str] = set()
    for e in experts:
        for m, (a, b) in e.modules.items():
            layer = mods.get(m)
            if not isinstance(layer, nn.Linear):
                raise UsageError(
                    f"adapter {e.name!r} adapts {m!r}, which is not a linear layer of the base model "
                    "(trained on another base?)"
                )
            if a.shape[1] != layer.in_features or b.shape[0] != layer.out_features:
                raise UsageError(
                    f"adapter {e.name!r}: {m} has shape {tuple(b.shape[:1]) + tuple(a.shape[1:])}, the base "
                    f"model's layer is ({layer.out_features}, {layer.in_features}) (trained on another base?)"
                )
            names.add(m)
    return sorted(names)
