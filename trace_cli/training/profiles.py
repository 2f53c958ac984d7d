"""GRPO profiles per model size (`--profile 0.6b|4b|8b|auto`): the per-turn tokens, the episode budget, the batch
sizes and vLLM's memory for one 80 GB GPU, from KV-cache arithmetic (schemas/profiles/grpo-qwen3-<size>.yaml says
how each was sized). A profile is a layer of the `train` config: under the config's own keys and `--set`, over the
defaults (stages/train.py). `auto` picks the profile nearest the checkpoint's parameter count (none for a model
under 0.3B: the CPU-sized models keep the schema's defaults); on a visible GPU the rollout batch is recomputed from
the free memory (`kv_rollout_batch`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import resources
from typing import Any

from trace_cli.errors import UsageError

SIZES = {"0.6b": 0.6e9, "4b": 4.0e9, "8b": 8.0e9}
CHOICES = (*SIZES, "auto")
SMALLEST = 0.3e9  # auto: a model below this gets no profile
# what vLLM's paged cache holds per episode, for planning: τ²-length episodes run 2-6k tokens (their first prompt
# included); the budget (max_completion_length) bounds one, the mean sizes the batch
PLANNED_EPISODE_TOKENS = 4096
MAX_ROLLOUT_BATCH = 128


def load(size: str) -> dict[str, Any]:
    """A profile's config keys."""
    import yaml

    if size not in SIZES:
        raise UsageError(f"profile {size!r}: expected one of {', '.join(CHOICES)}")
    text = (resources.files("trace_cli") / "schemas" / "profiles" / f"grpo-qwen3-{size}.yaml").read_text()
    return dict(yaml.safe_load(text))


def _text(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def parameters(model_cfg: Any) -> int:
    """A decoder's parameter count from its config (attention, MLP, embeddings; norms left out)."""
    c = _text(model_cfg)
    h, layers = int(c.hidden_size), int(c.num_hidden_layers)
    heads = int(c.num_attention_heads)
    kv = int(getattr(c, "num_key_value_heads", None) or heads)
    hd = int(getattr(c, "head_dim", None) or h // heads)
    attn = h * hd * (heads + 2 * kv) + heads * hd * h
    mlp = 3 * h * int(c.intermediate_size)
    emb = int(c.vocab_size) * h * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    return layers * (attn + mlp) + emb


def kv_bytes_per_token(model_cfg: Any, dtype_bytes: int = 2) -> int:
    """Keys and values of every layer for one token (bf16)."""
    c = _text(model_cfg)
    heads = int(c.num_attention_heads)
    kv = int(getattr(c, "num_key_value_heads", None) or heads)
    hd = int(getattr(c, "head_dim", None) or int(c.hidden_size) // heads)
    return 2 * int(c.num_hidden_layers) * kv * hd * dtype_bytes


def nearest(model_cfg: Any) -> str | None:
    """The profile nearest the model's size (in log scale); None under SMALLEST."""
    n = parameters(model_cfg)
    if n < SMALLEST:
        return None
    return min(SIZES, key=lambda s: abs(math.log(n / SIZES[s])))


def kv_rollout_batch(model_cfg: Any, profile: Mapping[str, Any], total_bytes: int) -> int:
    """Episodes generated together on a card of `total_bytes`: vLLM's share (`gpu_memory_utilization`) less the
    bf16 weights, over PLANNED_EPISODE_TOKENS of KV per episode, in whole groups (at least one), at most
    MAX_ROLLOUT_BATCH."""
    share = float(profile["vllm"]["gpu_memory_utilization"]) * total_bytes - 2 * parameters(model_cfg)
    per_episode = kv_bytes_per_token(model_cfg) * PLANNED_EPISODE_TOKENS
    g = int(profile["num_generations"])
    n = int(max(0.0, share) // per_episode)
    return max(g, min(MAX_ROLLOUT_BATCH, n) // g * g)


def resolve(choice: str, model_path: Any, total_bytes: int | None = None) -> tuple[dict[str, Any], str]:
    """(the profile's config keys, a line saying what was chosen) for `choice` and the model at `model_path`;
    `total_bytes`: the GPU's memory when one is visible (the rollout batch is then computed, not the 80 GB one)."""
    from transformers import AutoConfig

    if choice not in CHOICES:
        raise UsageError(f"profile {choice!r}: expected one of {', '.join(CHOICES)}")
    try:
        model_cfg = AutoConfig.from_pretrained(str(model_path))
    except Exception as e:  # noqa: BLE001 - the model's own checks report it; the profile cannot be sized
        raise UsageError(f"profile {choice}: cannot read the model's config: {e}") from e
    size = nearest(model_cfg) if choice == "auto" else choice
    n = parameters(model_cfg)
    if size is None:
        return {}, f"profile auto: {n / 1e9:.2f}B parameters, under {SMALLEST / 1e9:.1f}B: no profile"
    values = load(size)
    line = f"profile {size} ({'auto: ' if choice == 'auto' else ''}{n / 1e9:.2f}B parameters)"
    if total_bytes:
        values["rollout_batch_size"] = kv_rollout_batch(model_cfg, values, total_bytes)
        line += f", rollout_batch_size {values['rollout_batch_size']} from {total_bytes / 2**30:.0f} GiB"
    return values, line


def gpu_bytes() -> int | None:
    """The visible GPU's total memory (None on a CPU)."""
    from trace_cli.models import device

    if not device.is_cuda():
        return None
    import torch

    return int(torch.cuda.get_device_properties(device.resolve()).total_memory)
