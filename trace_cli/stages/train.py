"""Stage `train`: `method: sft` fine-tunes a model on environment demonstrations -> a `model` artifact;
`method: grpo` trains one LoRA adapter with GRPO on an environment's reward -> an `adapter` artifact.

Deficits withhold named behaviours from the SFT demonstrations, so the demo's base agent fails where we
decided it would; the capabilities it lacks are then what `diagnose` has to find, and what a GRPO adapter
trained on a synthesized environment (or on the target itself: the "GRPO on target" baseline) adds back.

GRPO runs in a deterministic work dir `STORE/.tmp/train-<id>/` (checkpoints every N steps), so `--resume`
finds an interrupted run; the adapter artifact appears only when training finished (atomic commit). Under
`accelerate launch` every rank trains, and only rank 0 touches the store: the work dir's lock and marker,
the artifact, the DuckDB index.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.errors import CheckFailed, UsageError, ValidationError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import GRPO_METRICS, SFT_METRICS

NAME = "train"
# Every output a train step can have (recipes validate `${steps.X.outputs.NAME}` against this); one
# invocation produces one of them: `model` for sft, `adapter` for grpo (Prepared.outputs).
OUTPUTS = {"model": "model", "adapter": "adapter"}
METHOD_OUTPUTS = {"sft": {"model": "model"}, "grpo": {"adapter": "adapter"}}
METRICS_FILE, METRICS_SCHEMA, GRPO_METRICS_SCHEMA = SFT_METRICS.file, SFT_METRICS.schema, GRPO_METRICS.schema

ADAPTER_DIR = "adapter"
RESOLVED_CONFIG_FILE = "train_config.json"
WORK_PREFIX = "train-"
WORK_MARKER = (
    "RESUMABLE"  # marks a GRPO work dir that `--resume` can continue (see the gc note in the stage docs)
)

SFT_ONLY = ("deficits", "deficit_rate", "epochs", "batch_size", "max_minutes", "max_length", "loss_on")
GRPO_ONLY = (
    "capability",
    "max_steps",
    "num_generations",
    "per_device_batch_size",
    "gradient_accumulation_steps",
    "lr_scheduler",
    "warmup_steps",
    "temperature",
    "top_p",
    "top_k",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "drop_constant_groups",
    "require_learning",
    "num_iterations",
    "max_grad_norm",
    "max_turns",
    "max_new_tokens",
    "max_completion_length",
    "rollout_batch_size",
    "checkpoint_every",
    "resume",
    "precision",
    "gradient_checkpointing",
    "use_vllm",
    "vllm",
)
DEFAULT_LR = {"sft": 0.002, "grpo": 1e-5}  # from-scratch presets (toy values; the demo depends on them)

NOT_IN_ID = ("checkpoint_every",)  # how often we checkpoint does not change what is trained
PROMPT_CHECK_SEEDS = 8


def _method_config(config: dict[str, Any]) -> dict[str, Any]:
    """Schema-check, reject the other method's keys (all at once), fill this method's defaults."""
    raw = dict(config or {})
    method = raw.get("method")
    other = {"sft": GRPO_ONLY, "grpo": SFT_ONLY}.get(method, ())
    errors = [
        f"{k}: only used by method {'grpo' if method == 'sft' else 'sft'} (method is {method})"
        for k in other
        if k in raw
    ]
    lora = raw.get("lora")
    if method == "grpo" and isinstance(lora, dict) and lora.get("enabled") is False:
        errors.append("lora.enabled: grpo always trains a LoRA adapter; drop the key")
    if method == "grpo":
        raw.setdefault("lora", {})  # so the schema's LoRA defaults (r 16, alpha 16, ...) are filled in
    try:
        cfg = checked_config(NAME, raw)
    except ValidationError as e:
        raise ValidationError(e.errors + errors) from None
    if errors:
        raise ValidationError(errors)
    for k in other:
        cfg.pop(k, None)
    cfg.setdefault("learning_rate", DEFAULT_LR[method])
    if method == "grpo":
        cfg["lora"] = {k: v for k, v in cfg["lora"].items() if k != "enabled"}
    return cfg


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = _method_config(config)
    from trace_cli.training import checks

    checks.kind_defaults(cfg, dict(config or {}), store, DEFAULT_LR)
    if cfg["method"] == "grpo":
        if "seeds" not in (config or {}):
            cfg["seeds"] = _env_train_seeds(cfg["env"], store) or cfg["seeds"]
        return _prepare_grpo(cfg, store)
    return _prepare_sft(cfg, store)


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    if prepared.config["method"] == "grpo":
        return _run_grpo(prepared, store, name=name, overrides=overrides, replace=replace)
    return _run_sft(prepared, store, name=name, overrides=overrides, replace=replace)


# ---------------------------------------------------------------------------------------------- sft
def _prepare_sft(cfg: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import make_env
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.eval import parse_seeds

    seeds = parse_seeds(cfg["seeds"])
    env = make_env(cfg["env"], store=store)
    if cfg["deficits"]:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            raise UsageError(f"env {cfg['env']!r} cannot build demonstrations with deficits")
        env.reset(seeds[0])
        demo(set(cfg["deficits"]))  # raises UsageError naming an unknown deficit
    model = resolve_model(cfg["model"], store)
    if model.kind != "hf":
        raise UsageError(
            f"--model {cfg['model']!r}: SFT starts from a model (store://model/NAME or an HF dir), "
            f"not a {model.kind}"
        )
    from trace_cli.training.checks import check_prefix, load_tokenizer

    check_prefix(load_tokenizer(model, f"--model {cfg['model']!r}"), cfg["env"], seeds, store, "sft")
    env_id = env_identity(cfg["env"], store=store)
    id_config = {**cfg, "model": model.digest, "env": env_id["id"]}
    p = Prepared(
        NAME, cfg, id_config, [model.as_input("model")] + env_id["inputs"], dict(METHOD_OUTPUTS["sft"])
    ).finalize()
    p.extra.update(model=model, seeds=seeds)
    return p


def _run_sft(
    prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False
) -> dict[str, Artifact]:
    import sys

    from trace_cli.models.refs import load_hf
    from trace_cli.training.sft import demonstrations, tokenize, train_sft

    cfg = prepared.config
    model, tok = load_hf(prepared.extra["model"])
    lora = cfg.get("lora") or {}
    if lora.get("enabled"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules=lora["target_modules"],
                task_type="CAUSAL_LM",
            ),
        )
    demos = demonstrations(
        cfg["env"],
        prepared.extra["seeds"],
        set(cfg["deficits"]),
        store,
        deficit_rate=cfg["deficit_rate"],
        seed=cfg["seed"],
    )
    from trace_cli.models.importer import context_of

    ctx = context_of(model.config)
    limit = cfg["max_length"] if cfg["max_length"] is not None else ctx
    if ctx and limit and limit > ctx:
        raise UsageError(f"max_length {limit} exceeds the model's context ({ctx}); lower it")
    examples = tokenize(tok, demos, limit, cfg.get("loss_on", "assistant"))
    dropped = len(demos) - len(examples)
    if not examples:
        raise UsageError(
            f"no demonstration fits max_length={limit} (model context {ctx}); "
            + ("raise it" if cfg["max_length"] is not None else "use a model with a longer context")
        )
    if dropped:
        print(
            f"sft: dropped {dropped} of {len(demos)} demonstrations longer than {limit} tokens",
            file=sys.stderr,
        )

    def log(m: dict[str, Any]) -> None:
        if m["step"] % 10 == 0:
            print(
                f"step {m['step']:>5}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  {m['elapsed_s']:.0f}s",
                file=sys.stderr,
            )

    metrics = train_sft(
        model,
        tok,
        examples,
        epochs=cfg["epochs"],
        lr=cfg["learning_rate"],
        batch_size=cfg["batch_size"],
        seed=cfg["seed"],
        max_minutes=cfg["max_minutes"],
        log=log,
    )
    if lora.get("enabled"):
        model = model.merge_and_unload()
    with prepared.writer(store, "model", name=name, overrides=overrides, replace=replace) as w:
        from trace_cli.models.importer import copy_meta

        model.save_pretrained(w.path / "hf")
        tok.save_pretrained(w.path / "hf")  # with the chat template it was trained with
        copy_meta(prepared.extra["model"].path, w.path / "hf")
        pq.write_table(pa.Table.from_pylist(metrics, schema=METRICS_SCHEMA), w.path / METRICS_FILE)
        last = metrics[-10:]
        w.summary.update(
            {
                "method": "sft",
                "base_model": cfg["model"],
                "deficits": cfg["deficits"],
                "deficit_rate": cfg["deficit_rate"],
                "demonstrations": len(examples),
                "dropped_demonstrations": dropped,
                "max_length": max(len(x) for x, _ in examples),
                "context": ctx,
                "learning_rate": cfg["learning_rate"],
                "steps": len(metrics),
                "final_loss": sum(m["loss"] for m in last) / max(1, len(last)),
                "train_s": round(metrics[-1]["elapsed_s"], 1) if metrics else 0.0,
                "parameters": sum(p.numel() for p in model.parameters()),
            }
        )
    return {"model": w.artifact}


# ---------------------------------------------------------------------------------------------- grpo
def work_dir(store: Store, artifact_id: str) -> Path:
    """The deterministic work dir of a GRPO run (checkpoints): the same on every rank and on --resume."""
    return store.tmp_root / f"{WORK_PREFIX}{artifact_id}"


def _env_train_seeds(env_ref: Any, store: Store) -> str | None:
    """A synthesized environment declares its train/eval seed split (environment.yaml `seeds.train`); GRPO
    trains on the train range unless `seeds` is given."""
    if not (isinstance(env_ref, str) and env_ref.startswith("store://")):
        return None
    from trace_cli.config.loading import load_artifact_yaml

    try:
        art = store.resolve(env_ref, kind="environment")
        doc = load_artifact_yaml(art.path / "environment.yaml") or {}
    except Exception:  # noqa: BLE001 - make_env reports a bad reference properly, right after
        return None
    train = (doc.get("seeds") or {}).get("train")
    return train if isinstance(train, str) else None


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


def _prepare_grpo(cfg: dict[str, Any], store: Store) -> Prepared:
    """Resolve and check everything a GRPO run needs before any compute: references, batch arithmetic,
    prompt length against the model's context, vLLM availability."""
    import importlib.util

    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import make_env
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.eval import parse_seeds
    from trace_cli.training.grpo import world_size

    resume = bool(cfg.pop("resume", False))
    seeds = parse_seeds(cfg["seeds"])
    env = make_env(cfg["env"], store=store)
    model = resolve_model(cfg["model"], store)
    if model.kind != "hf":
        raise UsageError(
            f"--model {cfg['model']!r}: GRPO trains a LoRA on a base model (store://model/NAME, an HF "
            f"dir or a cached hub id), not on a {model.kind}"
        )
    # batch arithmetic (TRL: per_device_train_batch_size counts completions, the global batch must hold whole groups)
    world = world_size()
    g = cfg["num_generations"]
    per_step = cfg["per_device_batch_size"] * world * cfg["gradient_accumulation_steps"]
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
    if cfg["max_new_tokens"] > cfg["max_completion_length"]:
        raise UsageError(
            f"max_new_tokens ({cfg['max_new_tokens']}) exceeds max_completion_length "
            f"({cfg['max_completion_length']}), the budget of the whole episode"
        )
    if cfg["use_vllm"]:
        if importlib.util.find_spec("vllm") is None:
            raise UsageError(
                "use_vllm: vllm is not installed (pip install 'trl[vllm]' on a GPU machine); "
                "or drop use_vllm to generate with transformers"
            )
        import torch

        if not torch.cuda.is_available():
            raise UsageError("use_vllm: vLLM generation needs a CUDA GPU; none is visible")
    if cfg["precision"] == "bf16":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("precision bf16 needs a GPU here; use precision auto or fp32 on CPU")
    # prompt length against the model's context
    from transformers import AutoConfig, AutoTokenizer

    try:
        mcfg = AutoConfig.from_pretrained(model.path)
        tok = AutoTokenizer.from_pretrained(model.path)
    except Exception as e:  # noqa: BLE001 - any failure here means the directory is not a usable model
        raise UsageError(f"--model {cfg['model']!r}: cannot load its config/tokenizer: {e}") from e
    ctx = getattr(mcfg, "max_position_embeddings", None) or getattr(
        getattr(mcfg, "text_config", None), "max_position_embeddings", None
    )
    from trace_cli.training.checks import check_prefix

    check_prefix(tok, cfg["env"], seeds, store, "grpo")
    lengths = _initial_prompt_tokens(env, seeds[:PROMPT_CHECK_SEEDS], tok)
    seed_long, longest = max(lengths, key=lambda x: x[1])
    if ctx and longest + cfg["max_completion_length"] > ctx:
        room = ctx - longest
        raise UsageError(
            f"context: the first prompt of seed {seed_long} is {longest} tokens; with max_completion_length "
            f"{cfg['max_completion_length']} an episode needs {longest + cfg['max_completion_length']} tokens, more "
            f"than the model's context ({ctx})",
            hint=f"--set max_completion_length={room}" if room > 0 else "use a model with a longer context",
        )
    env.reset(seeds[0])
    capability = cfg["capability"] or (env.task_metadata() or {}).get("capability")
    env_id = env_identity(cfg["env"], store=store)
    id_config = {k: v for k, v in cfg.items() if k not in NOT_IN_ID}
    id_config.update(model=model.digest, env=env_id["id"])
    p = Prepared(
        NAME, cfg, id_config, [model.as_input("model")] + env_id["inputs"], dict(METHOD_OUTPUTS["grpo"])
    ).finalize()
    p.extra.update(
        model=model,
        seeds=seeds,
        resume=resume,
        world=world,
        capability=capability,
        prompt_tokens=longest,
        context=ctx,
    )
    return p


def _divisor_hint(per_step: int, g: int) -> int:
    """The largest group size <= g that divides the episodes per step (at least 2)."""
    return next((d for d in range(g, 1, -1) if per_step % d == 0), 2)


def _lock(path: Path):
    """An exclusive advisory lock held for the run (released by the OS if the process dies)."""
    import fcntl

    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise UsageError(
            f"another `trace train` is running this exact job (lock {path} is held); wait for it or kill it"
        ) from None
    return fh


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _run_grpo(
    prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False
) -> dict[str, Artifact]:
    import sys

    from accelerate import PartialState

    from trace_cli.envs.registry import make_env
    from trace_cli.training.grpo import (
        GRPOSpec,
        copy_adapter,
        latest_checkpoint,
        metrics_rows,
        rollouts_after,
        train_grpo,
    )

    cfg = prepared.config
    ref = prepared.extra["model"]
    import torch

    # joins the process group when launched by accelerate/torchrun; cpu=True as the Trainer will (use_cpu), else
    # a GPU-less multi-process launch would be seen as N independent single processes
    state = PartialState(cpu=not torch.cuda.is_available())
    main = state.is_main_process
    world = state.num_processes
    work = work_dir(store, prepared.id)
    ckpts = work / "checkpoints"
    lock = None
    if main:
        store.ensure()
        work.mkdir(parents=True, exist_ok=True)
        lock = _lock(work / ".lock")
        found = latest_checkpoint(ckpts)
        if found is not None and not prepared.extra["resume"]:
            print(
                f"train: discarding the checkpoint of an interrupted run ({found.name}); pass --resume to "
                "continue from it",
                file=sys.stderr,
            )
            shutil.rmtree(ckpts, ignore_errors=True)
        elif found is None and prepared.extra["resume"]:
            print("train: --resume: no checkpoint of this run found; starting from step 0", file=sys.stderr)
        (work / WORK_MARKER).write_text(
            json.dumps(
                {"id": prepared.id, "kind": "adapter", "stage": NAME, "pid": os.getpid(), "world_size": world}
            )
            + "\n"
        )
    state.wait_for_everyone()
    resume_from = latest_checkpoint(ckpts) if prepared.extra["resume"] else None
    if main and resume_from is not None:
        print(f"train: resuming from {resume_from.name}", file=sys.stderr)

    def log(m: dict[str, Any]) -> None:
        if main:
            print(
                f"step {m['step']:>4}/{cfg['max_steps']}  reward {_fmt(m.get('reward'))} ± {_fmt(m.get('reward_std'))}"
                f"  success {_fmt(m.get('success'), '.2f')}  const groups {_fmt(m.get('frac_reward_zero_std'), '.2f')}"
                f"  len {_fmt(m.get('completions/mean_length'), '.0f')}  lr {_fmt(m.get('learning_rate'), '.1e')}",
                file=sys.stderr,
            )

    env_ref = cfg["env"]
    spec = GRPOSpec(
        model_path=str(ref.path),
        make_env=lambda: make_env(env_ref, store=store),
        seeds=prepared.extra["seeds"],
        output_dir=str(ckpts),
        resume_from=str(resume_from) if resume_from else None,
        log=log,
        **{
            k: cfg[k]
            for k in (
                "num_generations",
                "per_device_batch_size",
                "gradient_accumulation_steps",
                "max_steps",
                "learning_rate",
                "lr_scheduler",
                "warmup_steps",
                "temperature",
                "top_p",
                "top_k",
                "beta",
                "epsilon",
                "epsilon_high",
                "loss_type",
                "scale_rewards",
                "num_iterations",
                "max_grad_norm",
                "drop_constant_groups",
                "max_turns",
                "max_new_tokens",
                "max_completion_length",
                "rollout_batch_size",
                "lora",
                "checkpoint_every",
                "precision",
                "gradient_checkpointing",
                "use_vllm",
                "vllm",
                "seed",
            )
        },
    )
    result = train_grpo(spec)
    rows = metrics_rows(result.log_history, lambda s: rollouts_after(spec, world, s))
    if main:
        from trace_cli.training import checks

        failed = checks.nothing_learned(rows, result.adapter_dir) if cfg["require_learning"] else None
        if failed:
            shutil.rmtree(work, ignore_errors=True)
            if lock is not None:
                lock.close()
            raise CheckFailed(f"grpo: {failed}; no adapter stored")
    if main:
        with prepared.writer(store, "adapter", name=name, overrides=overrides, replace=replace) as w:
            copy_adapter(result.adapter_dir, w.path / ADAPTER_DIR)
            from trace_cli.training.checks import save_tokenizer

            save_tokenizer(ref.path, w.path / ADAPTER_DIR)
            pq.write_table(pa.Table.from_pylist(rows, schema=GRPO_METRICS_SCHEMA), w.path / METRICS_FILE)
            resolved = {
                k: v
                for k, v in vars(spec).items()
                if k not in ("make_env", "log", "output_dir", "resume_from")
            }
            resolved.update(
                world_size=world,
                episodes_per_step=rollouts_after(spec, world, 1),
                seeds_per_step=rollouts_after(spec, world, 1) // spec.num_generations,
                env=cfg["env"],
                capability=prepared.extra["capability"],
            )
            (w.path / RESOLVED_CONFIG_FILE).write_text(
                json.dumps(resolved, indent=2, sort_keys=True, default=str) + "\n"
            )
            w.summary.update(_grpo_summary(prepared, ref, rows, result, world))
        art = w.artifact
    state.wait_for_everyone()
    if main:
        shutil.rmtree(work, ignore_errors=True)
        if lock is not None:
            lock.close()
    else:
        art = store.get("adapter", prepared.id)
    return {"adapter": art}


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def _grpo_summary(prepared: Prepared, ref, rows: list[dict[str, Any]], result, world: int) -> dict[str, Any]:
    cfg = prepared.config
    head, tail = rows[: min(5, len(rows))], rows[-min(5, len(rows)) :]
    return {
        "method": "grpo",
        "capability": prepared.extra["capability"],
        "env": cfg["env"],
        "base_model": cfg["model"],
        "base_model_uri": f"store://model/{ref.artifact_id}" if ref.artifact_id else None,
        "base_model_path": str(ref.path),
        "steps": result.global_step,
        "rollouts": rows[-1]["rollouts"] if rows else 0,
        "episodes_per_step": rows[0]["episodes"] if rows else None,
        "num_generations": cfg["num_generations"],
        "world_size": world,
        "reward_first": _mean(head, "reward"),
        "reward_last": _mean(tail, "reward"),
        "success_first": _mean(head, "success"),
        "success_last": _mean(tail, "success"),
        "frac_constant_groups": _mean(rows, "frac_reward_zero_std"),
        "train_s": round(result.train_runtime_s, 3),
        "train_cpu_s": round(result.train_cpu_s, 3),
        "resumed_from_step": result.resumed_from_step,
        "trainable_parameters": result.trainable_parameters,
        "parameters": result.total_parameters,
        "lora_r": cfg["lora"]["r"],
        "lora_alpha": cfg["lora"]["alpha"],
        "prompt_tokens_max": prepared.extra.get("prompt_tokens"),
        "context": prepared.extra.get("context"),
    }
