"""Checks and defaults of the `train` stage that depend on the model: real checkpoints vs from-scratch presets,
prefix preservation before training, and "did GRPO learn anything" after it (issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_cli.errors import UsageError

# real checkpoints (`trace model import`): LoRA SFT at 3e-4 (measured on SmolLM2-135M: 2e-3 raised the loss
# from 0.75 to 2.65 in one step; 3e-4 learned exact first tool calls in 60 steps), GRPO at the paper's 1e-5
PRETRAINED_LR = {"sft": 3e-4, "grpo": 1e-5}
PREFIX_CHECK_SEEDS = 3


def kind_defaults(cfg: dict[str, Any], raw: dict[str, Any], store, default_lr: dict[str, float]) -> None:
    """Defaults that depend on the model kind: a real checkpoint (imported; `trace_model.json`) gets the
    paper's / measured values (LoRA SFT at 3e-4, SFT max_length from the demonstrations within the context),
    a from-scratch preset keeps the toy values it was tuned with. Keys the user set are never changed."""
    from trace_cli.models.importer import read_meta
    from trace_cli.models.refs import resolve_model

    method = cfg["method"]
    try:
        ref = resolve_model(cfg["model"], store)
        pretrained = ref.kind == "hf" and read_meta(ref.path).get("kind") == "pretrained"
    except UsageError:
        pretrained = False  # the method's own checks report the reference properly
    if "learning_rate" not in raw:
        cfg["learning_rate"] = (PRETRAINED_LR if pretrained else default_lr)[method]
    if method == "sft" and pretrained:
        if "enabled" not in (raw.get("lora") or {}):
            lora = {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}  # schema defaults
            cfg["lora"] = {**lora, **(cfg.get("lora") or {}), "enabled": True}
        if "max_length" not in raw:
            cfg["max_length"] = None  # what the demonstrations need, within the model's context


def check_prefix(tok, env_ref: Any, seeds: list[int], store, what: str) -> None:
    """Training needs a prefix-preserving template (the prompt at turn k is a prefix of the transcript):
    checked on a few reference demonstrations before any compute."""
    from trace_cli.models.chat import prefix_problems
    from trace_cli.training.sft import demonstrations

    demos = demonstrations(env_ref, seeds[:PREFIX_CHECK_SEEDS], set(), store)
    bad = prefix_problems(tok, demos)
    if bad:
        raise UsageError(
            f"{what}: the model's chat template is not prefix-preserving ({bad[0]}); training would teach "
            "continuations the model never meets when it acts",
            hint="re-import the model with a built-in template: trace model import SOURCE --chat-template hermes",
        )


def load_tokenizer(model, what: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model.path)
    except Exception as e:  # noqa: BLE001 - any failure here means the directory is not a usable model
        raise UsageError(f"{what}: cannot load its tokenizer: {e}") from e


def nothing_learned(rows: list[dict[str, Any]], adapter_dir: Path) -> str | None:
    """Why a finished GRPO run learned nothing (None when it did): every group had a constant reward (no
    advantage, no gradient), or the adapter's lora_B tensors are all zero (LoRA starts there)."""
    fracs = [r.get("frac_reward_zero_std") for r in rows]
    if fracs and all(f is not None and f >= 1.0 for f in fracs):
        rewards = sorted({round(r["reward"], 4) for r in rows if r.get("reward") is not None})
        return (
            f"every group of every step had a constant reward (mean rewards {rewards}): nothing to learn from; "
            "make the task easier or harder (calibrate the environment) or raise num_generations/temperature"
        )
    from safetensors import safe_open

    f = Path(adapter_dir) / "adapter_model.safetensors"
    if f.is_file():
        with safe_open(str(f), "pt") as t:
            keys = [k for k in t.keys() if "lora_B" in k]
            if keys and all(not t.get_tensor(k).any() for k in keys):
                return "the adapter's lora_B tensors are all zero: no update reached the adapter"
    return None


def save_tokenizer(model_dir: Path, dst: Path) -> None:
    """The adapter carries the tokenizer and chat template it was trained with (and the model's meta)."""
    from transformers import AutoTokenizer

    from trace_cli.models.importer import copy_meta

    AutoTokenizer.from_pretrained(model_dir).save_pretrained(dst)
    copy_meta(model_dir, dst)
