"""Stage `train`: `method: sft` fine-tunes a model on environment demonstrations -> a `model` artifact;
`method: grpo` trains one LoRA adapter with GRPO on an environment's reward -> an `adapter` artifact.

Deficits withhold named behaviours from the SFT demonstrations, so the demo's base agent fails where we
decided it would; the capabilities it lacks are then what `diagnose` has to find, and what a GRPO adapter
trained on a synthesized environment (or on the target itself: the "GRPO on target" baseline) adds back.

The config schema branches on `method`: each branch states that method's defaults and refuses the other
method's keys, so which keys belong to which method is read from the schema (SFT_ONLY, GRPO_ONLY). Defaults that
depend on the model kind (real checkpoint or from-scratch preset) go under the config's own keys
(training/checks.py).

GRPO runs in a deterministic work dir `STORE/.tmp/train-<id>/` (checkpoints every N steps), so `--resume`
finds an interrupted run; the adapter artifact appears only when training finished (atomic commit). Under
`accelerate launch` every rank trains, and only rank 0 touches the store: the work dir's lock and marker,
the artifact, the DuckDB index (training/checkpoints.py, training/dist.py).

`method: grpo` on a list of environments fans out (`fan_out`): one adapter per environment, keyed by the
capability its tasks train, run one by one by stages.base.execute_each (`trace train`, recipe steps).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from trace_cli.config.schemas import load_schema
from trace_cli.errors import UsageError, a
from trace_cli.stages.base import Prepared, apply_defaults, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import SFT_METRICS

NAME = "train"
# Every output a train step can have (recipes validate `${steps.X.outputs.NAME}` against this); one
# invocation produces one of them: `model` for sft, `adapter` for grpo (Prepared.outputs).
OUTPUTS = {"model": "model", "adapter": "adapter"}
METHOD_OUTPUTS = {"sft": {"model": "model"}, "grpo": {"adapter": "adapter"}}
# how often we checkpoint, and where live metrics go, do not change what is trained
# (snapshot_steps: the snapshots are artifacts of their own; the final adapter is the same with or without them)
# (profile: its values are in the config, resolved; the name adds nothing to what is trained)
NOT_IN_ID = ("checkpoint_every", "report_to", "logging_dir", "snapshot_steps", "profile")

# method -> the `then` properties of its branch in the schema: its defaults, and the other method's keys
BRANCHES: dict[str, dict[str, Any]] = {
    b["if"]["properties"]["method"]["const"]: b["then"]["properties"]
    for b in load_schema(f"config/{NAME}.v1.json")["allOf"]
}
OTHER = {"sft": "grpo", "grpo": "sft"}
FAN_OUT_FAILURE = "failed training"


def fans_out(config: Any) -> bool:
    """A list of environments asks for one GRPO adapter per environment."""
    return isinstance(config.get("env"), list)


def fan_out(config: Any, store: Store) -> list[tuple[str, dict[str, Any]]]:
    """(capability, config) per environment of the list, the capability being the one its tasks train (which
    the adapter's summary names, and composition labels its expert by)."""
    from trace_cli.config.frozen import thaw
    from trace_cli.config.seeds import parse_seeds
    from trace_cli.envs.registry import make_env

    if config.get("capability") is not None:
        raise UsageError("capability: each adapter is for its own environment's capability; drop it")
    members = []
    for i, ref in enumerate(config["env"]):
        cfg = {**thaw(config), "env": ref}
        seeds = cfg.get("seeds") or _env_train_seeds(ref, store) or _method_config(cfg)["seeds"]
        cap = _env_capability(make_env(ref, store=store), parse_seeds(seeds)[0])
        if not cap:
            raise UsageError(f"env[{i}] {ref!r}: its tasks name no capability to key its adapter by")
        members.append((cap, cfg))
    return members


def _only(method: str) -> tuple[str, ...]:
    """The keys only `method` uses: those the other method's branch refuses (`$defs/<method>_only`)."""
    ref = f"#/$defs/{method}_only"
    return tuple(k for k, s in BRANCHES[OTHER[method]].items() if s.get("$ref") == ref)


SFT_ONLY = _only("sft")
GRPO_ONLY = _only("grpo")


def _over(defaults: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` over `defaults`, nested blocks (lora) merged key by key; a null is "not given" (a flag left out)."""
    out = dict(defaults)
    for k, v in config.items():
        if v is None and k in defaults:
            continue
        both = isinstance(v, Mapping) and isinstance(out.get(k), Mapping)
        out[k] = {**out[k], **v} if both else v
    return out


def _method_config(
    config: Mapping[str, Any], kind_defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Schema-check the config (every error at once; the method's branch refuses the other method's keys) and
    fill defaults: its own keys over `kind_defaults` (the model kind's) over the method branch's over the shared
    ones. The other method's keys, filled in by the shared defaults, are dropped again."""
    raw = dict(config or {})
    method = raw.get("method")
    kind = dict(kind_defaults or {})
    branch = apply_defaults({}, {"properties": BRANCHES.get(method, {}) if isinstance(method, str) else {}})
    cfg = checked_config(NAME, _over(_over(branch, kind), raw))
    # a null default (max_length: what the demonstrations need) is no schema value; it is set after the check
    cfg.update({k: None for k, v in kind.items() if v is None and k not in raw})
    for k in _only(OTHER[method]):
        cfg.pop(k, None)
    if method == "grpo":
        cfg["lora"] = {k: v for k, v in cfg["lora"].items() if k != "enabled"}  # [sft]: grpo always has one
    return cfg


def method_config(
    config: Mapping[str, Any], kind_defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The train stage's config as the stage checks and fills it (schema defaults, the method's branch, the model
    kind's defaults): public for tools outside the package that configure a trainer as `trace train` would
    (benchmarks/train_bench.py, benchmarks/real_model_loop.py)."""
    return _method_config(config, kind_defaults)


def prepare(config: Mapping[str, Any], store: Store) -> Prepared:
    from trace_cli.training import checks

    cfg = _method_config(config)
    kind = checks.kind_defaults(cfg["method"], cfg["model"], store)
    if cfg["method"] == "grpo" and cfg.get("profile"):
        kind = _over(kind, _profile(cfg, store))
    if kind:
        cfg = _method_config(config, kind)
    if cfg["method"] == "grpo":
        if "seeds" not in (config or {}):
            cfg["seeds"] = _env_train_seeds(cfg["env"], store) or cfg["seeds"]
        return _prepare_grpo(cfg, store)
    return _prepare_sft(cfg, store)


def _profile(cfg: Mapping[str, Any], store: Store) -> dict[str, Any]:
    """The config keys of the run's GPU profile (training/profiles.py), said on stderr."""
    from trace_cli.models.refs import resolve_model
    from trace_cli.training import profiles
    from trace_cli.training.dist import is_main_process

    values, line = profiles.resolve(
        cfg["profile"], resolve_model(cfg["model"], store).path, profiles.gpu_bytes()
    )
    if is_main_process():
        print(f"train: {line}", file=sys.stderr)
    return values


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    if prepared.config["method"] == "grpo":
        return _run_grpo(prepared, store, name=name, overrides=overrides, replace=replace)
    return _run_sft(prepared, store, name=name, overrides=overrides, replace=replace)


def _base_model(cfg: dict[str, Any], store: Store, expected: str):
    """The model to start from, which must be a model (not an adapter, composition or policy)."""
    from trace_cli.models.refs import resolve_model

    model = resolve_model(cfg["model"], store)
    if model.kind != "hf":
        raise UsageError(f"--model {cfg['model']!r}: {expected} {a(model.kind)}")
    return model


def _prepared(
    cfg: dict[str, Any], id_config: dict[str, Any], model, store: Store, env_id: dict[str, Any] | None = None
) -> Prepared:
    """The invocation's id from its config (the model and environment by their digests) and its inputs
    (`env_id`: the environment's identity, when the caller has it already)."""
    from trace_cli.envs.refs import env_identity

    env_id = env_id or env_identity(cfg["env"], store=store)
    id_config = {**id_config, "model": model.digest, "env": env_id["id"]}
    inputs = [model.as_input("model")] + env_id["inputs"]
    return Prepared(NAME, cfg, id_config, inputs, dict(METHOD_OUTPUTS[cfg["method"]])).finalize()


def _to_stderr(line_of: Callable[[dict[str, Any]], str | None]) -> Callable[[dict[str, Any]], None]:
    """A metrics callback that prints `line_of(row)` to stderr (nothing for a row it gives None)."""

    def log(row: dict[str, Any]) -> None:
        line = line_of(row)
        if line:
            print(line, file=sys.stderr)

    return log


# ---------------------------------------------------------------------------------------------- sft
def _prepare_sft(cfg: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.config.seeds import parse_seeds
    from trace_cli.envs.registry import make_env
    from trace_cli.training.checks import check_prefix, load_tokenizer

    seeds = parse_seeds(cfg["seeds"])
    env = make_env(cfg["env"], store=store)
    if cfg["deficits"]:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            raise UsageError(f"env {cfg['env']!r} cannot build demonstrations with deficits")
        env.reset(seeds[0])
        demo(set(cfg["deficits"]))  # raises UsageError naming an unknown deficit
    model = _base_model(cfg, store, "SFT starts from a model (store://model/NAME or an HF dir), not")
    check_prefix(load_tokenizer(model, f"--model {cfg['model']!r}"), cfg["env"], seeds, store, "sft")
    # checkpointing trades compute for memory; what is trained stays the same (not in the id)
    p = _prepared(cfg, {k: v for k, v in cfg.items() if k != "gradient_checkpointing"}, model, store)
    p.extra.update(model=model, seeds=seeds)
    return p


def _run_sft(
    prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False
) -> dict[str, Artifact]:
    from trace_cli.models.importer import context_of, copy_meta
    from trace_cli.models.refs import load_hf
    from trace_cli.training import lora_config
    from trace_cli.training.dist import process_group
    from trace_cli.training.sft import SFTSettings, demonstrations, fit_examples, progress_line, train_sft

    cfg = prepared.config
    group = process_group()  # under accelerate launch: joins the group (and picks this rank's GPU) first
    main = group.is_main_process
    model, tok = load_hf(prepared.extra["model"])
    lora = cfg.get("lora") or {}
    if lora.get("enabled"):
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(lora))
    demos = demonstrations(
        cfg["env"],
        prepared.extra["seeds"],
        set(cfg["deficits"]),
        store,
        deficit_rate=cfg["deficit_rate"],
        seed=cfg["seed"],
    )
    ctx = context_of(model.config)
    examples = fit_examples(tok, demos, cfg["max_length"], ctx, cfg["loss_on"])
    log = _to_stderr(progress_line) if main else None
    metrics = train_sft(model, tok, examples, SFTSettings.from_config(cfg), log=log, group=group)
    if not main:  # every process trained the same model; rank 0 alone writes it
        group.wait_for_everyone()
        return {"model": store.get("model", prepared.id)}
    if lora.get("enabled"):
        model = model.merge_and_unload()
    with prepared.writer(store, "model", name=name, overrides=overrides, replace=replace) as w:
        model.save_pretrained(w.path / "hf")
        tok.save_pretrained(w.path / "hf")  # with the chat template it was trained with
        copy_meta(prepared.extra["model"].path, w.path / "hf")
        SFT_METRICS.write(metrics, w.path)
        last = metrics[-10:]
        w.summary.update(
            {
                "method": "sft",
                "base_model": cfg["model"],
                "deficits": cfg["deficits"],
                "deficit_rate": cfg["deficit_rate"],
                "demonstrations": len(examples),
                "dropped_demonstrations": len(demos) - len(examples),
                "max_length": max(len(x) for x, _ in examples),
                "context": ctx,
                "learning_rate": cfg["learning_rate"],
                "steps": len(metrics),
                "final_loss": sum(m["loss"] for m in last) / max(1, len(last)),
                "train_s": round(metrics[-1]["elapsed_s"], 1) if metrics else 0.0,
                "parameters": sum(p.numel() for p in model.parameters()),
                "world_size": group.num_processes,
            }
        )
    group.wait_for_everyone()
    return {"model": w.artifact}


# ---------------------------------------------------------------------------------------------- grpo
def _env_train_seeds(env_ref: Any, store: Store) -> str | None:
    """A synthesized environment declares its train/eval seed split (environment.yaml `seeds.train`); GRPO
    trains on the train range unless `seeds` is given."""
    if not (isinstance(env_ref, str) and env_ref.startswith("store://")):
        return None
    from trace_cli.envs.artifact import read_environment

    try:
        doc = read_environment(store.resolve(env_ref, kind="environment"))
    except Exception:  # noqa: BLE001 - make_env reports a bad reference properly, right after
        return None
    train = (doc.get("seeds") or {}).get("train")
    return train if isinstance(train, str) else None


def _prepare_grpo(cfg: dict[str, Any], store: Store) -> Prepared:
    """Resolve and check everything a GRPO run needs before any compute (training/checks.py grpo_preflight)."""
    from trace_cli.config.seeds import parse_seeds
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import make_env
    from trace_cli.training.checks import check_report_to, grpo_preflight

    resume = bool(cfg.pop("resume", False))  # not part of the id: a resumed run makes the same adapter
    rollout = _rollout_engine(cfg)
    seeds = parse_seeds(cfg["seeds"])
    env = make_env(cfg["env"], store=store)
    model = _base_model(
        cfg,
        store,
        "GRPO trains a LoRA on a base model (store://model/NAME, an HF dir or a cached hub id), not on",
    )
    checked = grpo_preflight(cfg, seeds, env, model, store)
    check_report_to(cfg["report_to"])
    capability = cfg["capability"] or _env_capability(env, seeds[0])
    id_config = {k: v for k, v in cfg.items() if k not in NOT_IN_ID and k != "rollout"}
    if rollout:  # the engine samples the episodes; the default (hf) leaves ids as they were
        id_config["rollout"] = rollout
    env_id = env_identity(cfg["env"], store=store)
    p = _prepared(cfg, id_config, model, store, env_id)
    # a snapshot after N steps is stored as what the same config with max_steps N trains (its id)
    snapshots = {
        n: _prepared(
            {**cfg, "max_steps": n, "snapshot_steps": []}, {**id_config, "max_steps": n}, model, store, env_id
        )
        for n in sorted(cfg.get("snapshot_steps") or [])
    }
    p.extra.update(
        model=model, seeds=seeds, resume=resume, capability=capability, snapshots=snapshots, **checked
    )
    return p


def _rollout_engine(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Check the `rollout` block (a server must answer: exit 2 before any compute) and fold the old `use_vllm`
    switch into it; returns what of it enters the artifact id (agents.engines.id_part)."""
    from trace_cli.agents.engines import RolloutSettings, id_part

    roll = dict(cfg["rollout"])
    if cfg["use_vllm"]:
        if roll["engine"] == "server":
            raise UsageError("use_vllm and rollout.engine server contradict each other: drop use_vllm")
        roll["engine"] = "vllm"
    cfg["rollout"], cfg["use_vllm"] = roll, roll["engine"] == "vllm"
    settings = RolloutSettings.of(roll)
    settings.check()
    if settings.engine == "server":
        settings.server().check()
    return id_part(roll)


def _env_capability(env: Any, seed: int) -> str | None:
    """The capability an environment's tasks train (its task_metadata at `seed`): what the adapter is for."""
    env.reset(seed)
    return (env.task_metadata() or {}).get("capability")


def _run_grpo(
    prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False
) -> dict[str, Artifact]:
    """One run (training.grpo_run.run_grpo), its snapshots and its adapter stored by rank 0; every other rank
    returns the artifact rank 0 stored."""
    from trace_cli.envs.registry import make_env
    from trace_cli.training.calibration_replay import calibration_replay
    from trace_cli.training.dist import is_main_process, world_size
    from trace_cli.training.grpo_run import GRPORun, run_grpo
    from trace_cli.training.metrics import progress_line

    cfg, ref, extra = prepared.config, prepared.extra["model"], prepared.extra
    main = is_main_process()
    if main:
        store.ensure()
    replay, why_not = calibration_replay(cfg, ref, store, world_size(), extra["episodes_per_step"])
    if why_not and main:
        print(f"train: not reusing calibration rollouts: {why_not}", file=sys.stderr)
    env_ref = cfg["env"]
    run = GRPORun(
        config=cfg,
        run_id=prepared.id,
        model_path=ref.path,
        make_env=lambda: make_env(env_ref, store=store),
        seeds=extra["seeds"],
        work_root=store.tmp_root,
        episodes_per_step=extra["episodes_per_step"],
        logging_dir=cfg["logging_dir"] or str(store.root / "logs" / "train" / prepared.id),
        resume=extra["resume"],
        replay=replay,
        log=_to_stderr(lambda m: progress_line(m, cfg["max_steps"])),
        marker={"kind": "adapter", "stage": NAME},
    )
    with run_grpo(run) as done:
        if done.main:
            snapshots = _store_snapshots(prepared, store, done)
            with prepared.writer(store, "adapter", name=name, overrides=overrides, replace=replace) as w:
                _write_adapter(w, prepared.config, prepared.extra, done)
                if snapshots:
                    w.summary["snapshots"] = snapshots
            art = w.artifact
    return {"adapter": art if done.main else store.get("adapter", prepared.id)}


def _write_adapter(w, cfg: Mapping[str, Any], extra: Mapping[str, Any], done) -> None:
    """An adapter artifact: the run's files (training.grpo_run.GRPOOutcome.write) and its summary (`cfg`: the
    artifact's config; `extra`: what the run's preparation resolved)."""
    ref, capability = extra["model"], extra["capability"]
    kept = done.write(w.path, {"max_steps": cfg["max_steps"], "env": cfg["env"], "capability": capability})
    w.summary.update(
        {
            "method": "grpo",
            "capability": capability,
            "env": cfg["env"],
            "base_model": cfg["model"],
            "base_model_uri": f"store://model/{ref.artifact_id}" if ref.artifact_id else None,
            "base_model_path": str(ref.path),
            **done.summary(),
            "prompt_tokens_max": extra.get("prompt_tokens"),
            "context": extra.get("context"),
        },
        training_episodes=kept,
    )


def _store_snapshots(prepared: Prepared, store: Store, done) -> dict[str, str]:
    """One adapter artifact per `snapshot_steps` entry: the adapter after N steps, stored as what the same config
    with max_steps N trains (its id, prepared with the run's: prepared.extra["snapshots"]), its first N metric
    rows. Returns {N: uri}; one already in the store is kept as it is."""
    out: dict[str, str] = {}
    for n, snap in prepared.extra["snapshots"].items():
        at = done.at(n)
        if at is None:  # training stopped before it (resumed past it without the snapshot): say so
            print(f"train: no snapshot at step {n} of {done.steps}", file=sys.stderr)
            continue
        if not store.exists("adapter", snap.id):
            with snap.writer(store, "adapter") as w:
                _write_adapter(w, snap.config, prepared.extra, at)
                w.summary["snapshot_of"] = prepared.id
        out[str(n)] = f"store://adapter/{snap.id}"
    return out
