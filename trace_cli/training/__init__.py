"""Trainers: SFT on demonstrations (plain PyTorch) and GRPO LoRA adapters (TRL + PEFT; the only place that imports
trl); their checks, checkpoints and metrics.

What both trainers share lives here: their settings are taken from the validated `train` config (the schema,
schemas/config/train.v1.json, is the one source of every default), and a LoRA is configured the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def from_config(cls: type[T], config: Mapping[str, Any], **run: Any) -> T:
    """The settings dataclass `cls` from a validated config: every field the config has a key for, then the
    run's own resolved objects (model path, parsed seeds, callbacks), which take precedence."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: v for k, v in config.items() if k in names}, **run})


def lora_config(lora: Mapping[str, Any]):
    """PEFT's LoraConfig from a config's `lora` block (r, alpha, dropout, target_modules)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["target_modules"],
        task_type="CAUSAL_LM",
    )
