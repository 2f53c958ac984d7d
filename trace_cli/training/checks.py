"""Checks and defaults of the `train` stage: defaults that depend on the model kind (real checkpoints vs
from-scratch presets), everything a run needs checked before any compute (prefix preservation, GRPO's batch
arithmetic, budgets and context), and "did GRPO learn anything" after it (issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_cli.config.sampling import SamplingSettings
from trace_cli.errors import UsageError

# real checkpoints (`trace model import`), method sft: a LoRA at 3e-4 (measured on SmolLM2-135M: 2e-3 raised the
# loss from 0.75 to 2.65 in one step; 3e-4 learned exact first tool calls in 60 steps), and demonstrations as long
# as they need within the model's context (None); grpo keeps the schema's values (the paper's) for both kinds
PRETRAINED_DEFAULTS: dict[str, dict[str, Any]] = {
    "sft": {"learning_rate": 3e-4, "lora": {"enabled": True}, "max_length": None}
}
PREFIX_CHECK_SEEDS = 3
PROMPT_CHECK_SEEDS = 8


def kind_defaults(method: str, model: str, store) -> dict[str, Any]:
    """Defaults that depend on the model kind, to go under the config's own keys: a real checkpoint (imported;
    `trace_model.json` says pretrained) gets PRETRAINED_DEFAULTS, a from-scratch preset none (the schema's toy
    values, which it was tuned with, stay)."""
    from trace_cli.models.importer import read_meta
    from trace_cli.models.refs import resolve_model

    try:
        ref = resolve_model(model, store)
        pretrained = ref.kind == "hf" and read_meta(ref.path).get("kind") == "pretrained"
    except UsageError:
        pretrained = False  # the method's own checks report the reference properly
    return dict(PRETRAINED_DEFAULTS.get(method, {})) if pretrained else {}


def check_prefix(tok, env_ref: Any, seeds: list[int], store, what: str) -> None:
    """Training needs a prefix-preserving template (the prompt at turn k is a prefix of the transcript):
    checked on a few reference demonstrations before any compute."""
    from trace_cli.models.chat import prefix_problems
    from trace_cli.training.sft import demonstrations

    demos = demonstrations(env_ref, seeds[:PREFIX_CHECK_SEEDS], set(), store, deficit_rate=0.0, seed=0)
    bad = prefix_problems(tok, demos)
    if bad:
        raise UsageError(
            f"{what}: the model's chat template is not prefix-preserving ({bad[0]}); training would teach "
            "continuations the model never meets when it acts",
            hint="re-import the model with a built-in template: trace model import SOURCE --chat-template hermes",
        )


def load_tokenizer(model, what: str, part: str = "tokenizer"):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model.path)
    except Exception as e:  # noqa: BLE001 - any failure here means the directory is not a usable model
        raise UsageError(f"{what}: cannot load its {part}: {e}") from e


# schedules whose learning rate at step k does not depend on max_steps: a snapshot after k steps is what a
# k-step run trains
SNAPSHOT_SCHEDULES = ("constant", "constant_with_warmup")


def _check_snapshots(cfg: dict[str, Any]) -> None:
    steps = cfg.get("snapshot_steps") or []
    if not steps:
        return
    late = [s for s in steps if s >= cfg["max_steps"]]
    if late:
        raise UsageError(
            f"snapshot_steps: {', '.join(map(str, late))} not below max_steps ({cfg['max_steps']}); the final "
            "adapter is stored anyway"
        )
    if cfg["lr_scheduler"] not in SNAPSHOT_SCHEDULES:
        raise UsageError(
            f"snapshot_steps: with lr_scheduler {cfg['lr_scheduler']} the learning rate at a step depends on "
            "max_steps, so a snapshot is not what a shorter run would train",
            hint=f"use lr_scheduler {' or '.join(SNAPSHOT_SCHEDULES)}, or train each length on its own",
        )


def grpo_preflight(cfg: dict[str, Any], seeds: list[int], env, model, store) -> dict[str, Any]:
    """What a GRPO run needs checked before any compute: batch arithmetic (TRL: per_device_train_batch_size
    counts completions, and the global batch must hold whole groups), enough seeds per step, the turn budget
    within the episode's, vLLM and bf16 availability, a prefix-preserving template, and the longest first prompt
    (of a few seeds) with the episode budget within the model's context. Returns the prompt length and context
    for the summary."""
    from trace_cli.training.dist import world_size
    from trace_cli.training.grpo_spec import episodes_per_step
    from trace_cli.training.validation import check_validation

    world = world_size()
    g = cfg["num_generations"]
    per_step = episodes_per_step(cfg, world)
    if per_step % g:
        raise UsageError(
            f"batch: per_device_batch_size ({cfg['per_device_batch_size']}) x processes ({world}) x "
            f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) = {per_step} episodes per step, "
            f"not a multiple of num_generations ({g}); every group of {g} rollouts of one seed must fit in a step",
            hint=f"e.g. --set per_device_batch_size={g} or --set num_generations={_divisor_hint(per_step, g)}",
        )
    groups = per_step // g
    if len(seeds) < groups:
        raise UsageError(
            f"seeds: {len(seeds)} seed(s) but each step needs {groups} different seeds "
            f"({per_step} episodes / num_generations {g}); widen --seeds"
        )
    _check_snapshots(cfg)
    check_validation(cfg.get("validation"), seeds)
    SamplingSettings.of(cfg)  # its cross-field checks (max_new_tokens within max_completion_length)
    _check_devices(cfg)
    from transformers import AutoConfig

    try:
        mcfg = AutoConfig.from_pretrained(model.path)
    except Exception as e:  # noqa: BLE001 - any failure here means the directory is not a usable model
        raise UsageError(f"--model {cfg['model']!r}: cannot load its config/tokenizer: {e}") from e
    tok = load_tokenizer(model, f"--model {cfg['model']!r}", "config/tokenizer")
    ctx = getattr(mcfg, "max_position_embeddings", None) or getattr(
        getattr(mcfg, "text_config", None), "max_position_embeddings", None
    )
    check_prefix(tok, cfg["env"], seeds, store, "grpo")
    seed_long, longest = max(_initial_prompt_tokens(env, seeds[:PROMPT_CHECK_SEEDS], tok), key=lambda x: x[1])
    if ctx and longest + cfg["max_completion_length"] > ctx:
        room = ctx - longest
        raise UsageError(
            f"context: the first prompt of seed {seed_long} is {longest} tokens; with max_completion_length "
            f"{cfg['max_completion_length']} an episode needs {longest + cfg['max_completion_length']} tokens, more "
            f"than the model's context ({ctx})",
            hint=f"--set max_completion_length={room}" if room > 0 else "use a model with a longer context",
        )
    return {"prompt_tokens": longest, "context": ctx, "episodes_per_step": per_step}


def _check_devices(cfg: dict[str, Any]) -> None:
    """use_vllm needs vllm and a CUDA GPU; precision bf16 a GPU (the device `$TRACE_DEVICE` resolves to)."""
    import importlib.util

    from trace_cli.models import device

    if cfg["use_vllm"]:
        if importlib.util.find_spec("vllm") is None:
            raise UsageError(
                "use_vllm: vllm is not installed (pip install 'trl[vllm]' on a GPU machine); "
                "or drop use_vllm to generate with transformers"
            )
        if not device.is_cuda():
            raise UsageError("use_vllm: vLLM generation needs a CUDA GPU; none is visible")
    if cfg["precision"] == "bf16":
        if not device.is_cuda():
            raise UsageError("precision bf16 needs a GPU here; use precision auto or fp32 on CPU")


def _divisor_hint(per_step: int, g: int) -> int:
    """The largest group size <= g that divides the episodes per step (at least 2)."""
    return next((d for d in range(g, 1, -1) if per_step % d == 0), 2)


def _initial_prompt_tokens(env, seeds: list[int], tok) -> list[tuple[int, int]]:
    """(seed, tokens of the first prompt: system + opening messages + tools + generation prompt)."""
    from trace_cli.models.chat import render

    out = []
    for s in seeds:
        obs = env.reset(s)
        messages = [{"role": "system", "content": obs.system_prompt}] + [dict(m) for m in obs.messages]
        text = render(tok, messages, obs.tools, add_generation_prompt=True)
        out.append((s, len(tok(text, add_special_tokens=False)["input_ids"])))
    return out


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


def check_report_to(report_to: str) -> None:
    """A live-metrics integration whose package is missing fails before any compute (exit 2)."""
    import importlib.util

    module = {"tensorboard": "tensorboard", "trackio": "trackio"}.get(report_to)
    if module and importlib.util.find_spec(module) is None:
        raise UsageError(
            f"report_to {report_to}: the {module} package is not installed (pip install {module})"
        )
