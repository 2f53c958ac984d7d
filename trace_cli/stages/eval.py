"""Stage `eval`: run a model on an environment; write a `rollouts` artifact and an `eval` artifact
(mean reward, pass@1, pass^k as τ²-bench defines it, per-task-family breakdown)."""

from __future__ import annotations

import json
from typing import Any

from trace_cli.agents.engines import RolloutSettings, id_part
from trace_cli.config.sampling import SamplingSettings
from trace_cli.config.seeds import parse_seeds
from trace_cli.errors import UsageError, a
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import EVAL_RESULTS, TASK_METADATA

NAME = "eval"
OUTPUTS = {"rollouts": "rollouts", "eval": "eval"}


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import make_env
    from trace_cli.models.refs import resolve_model

    if isinstance((config or {}).get("seeds"), str):
        # a malformed range ("abc", "-1:3") gets parse_seeds' message, not the schema's `oneOf` one
        # ("'abc' is not of type 'array'")
        parse_seeds(config["seeds"])
    cfg = checked_config(NAME, config)
    seeds = parse_seeds(cfg["seeds"])
    make_env(cfg["env"], store=store)  # validates name and params now, before any compute
    model = resolve_model(cfg["model"], store)
    if model.kind in ("hf", "adapter"):
        check_context(model, cfg["env"], seeds, cfg["max_new_tokens"], store)
    engine = check_engine(cfg["rollout"], model)
    env_id = env_identity(cfg["env"], store=store)
    id_config = {**cfg, "model": model.digest, "env": env_id["id"], "seeds": seeds}
    id_config.pop("rollout")
    if id_part(cfg["rollout"]):  # the engine samples the episodes; the default (hf) leaves ids as they were
        id_config["rollout"] = id_part(cfg["rollout"])
    inputs = [model.as_input("model")] + env_id.get("inputs", [])
    p = Prepared(NAME, cfg, id_config, inputs, dict(OUTPUTS)).finalize()
    p.extra.update(model=model, seeds=seeds, engine=engine)
    return p


def check_engine(block: Any, model) -> Any:
    """The run's rollout settings (agents.engines), checked before any compute: a server must answer (exit 2)."""
    settings = RolloutSettings.of(block)
    settings.check()
    if settings.engine != "hf":
        if model.kind not in ("hf", "adapter"):
            raise UsageError(
                f"rollout.engine {settings.engine}: --model {model.display!r} is {a(model.kind)}; only a model "
                "or an adapter runs on another engine (compositions and policies run on hf)"
            )
        if settings.engine == "server":
            settings.server().check()
    return settings


def check_context(model, env_ref: Any, seeds: list[int], max_new_tokens: int, store: Store) -> None:
    """The first prompt (system + tools + opening messages) and one turn must fit the model's context; later
    turns that outgrow it end their episode (termination max_length)."""
    from transformers import AutoConfig, AutoTokenizer

    from trace_cli.envs.registry import make_env
    from trace_cli.models.chat import render
    from trace_cli.models.importer import context_of
    from trace_cli.models.refs import has_tokenizer

    try:
        ctx = context_of(AutoConfig.from_pretrained(model.path))
        tok_dir = (
            model.adapter_path if model.adapter_path and has_tokenizer(model.adapter_path) else model.path
        )
        tok = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as e:  # noqa: BLE001 - any failure here means the directory is not a usable model
        raise UsageError(f"--model {model.display!r}: cannot load its config/tokenizer: {e}") from e
    if not ctx:
        return
    env = make_env(env_ref, store=store)
    obs = env.reset(seeds[0])
    messages = [{"role": "system", "content": obs.system_prompt}] + [dict(m) for m in obs.messages]
    n = len(
        tok(render(tok, messages, obs.tools, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
    )
    if n + max_new_tokens > ctx:
        raise UsageError(
            f"context: the first prompt of seed {seeds[0]} is {n} tokens; with max_new_tokens {max_new_tokens} "
            f"it needs {n + max_new_tokens}, more than the model's context ({ctx})",
            hint="use a model with a longer context, or lower --max-new-tokens",
        )


def summarize(rows: list[dict[str, Any]], trials: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """pass@1 / pass^k overall and per task family (k up to `trials`, lowered as τ²-bench does)."""
    from trace_cli.store.metrics import summarize as pass_summary

    summary, per_task = pass_summary(rows, "task_family", max_k=trials)
    summary["families"] = summary.pop("groups")
    return summary, per_task


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.compose.policy import load_policy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout
    from trace_cli.progress import Bar
    from trace_cli.store.rollouts import write_tables

    cfg = prepared.config
    seeds: list[int] = prepared.extra["seeds"]
    sampling = SamplingSettings.of(cfg)
    settings = prepared.extra["engine"]
    engine = None
    if settings.engine == "hf":
        policy = load_policy(prepared.extra["model"], **sampling.policy_kwargs(), seed=cfg["seed"])
    else:
        policy, engine = engine_policy(settings, prepared.extra["model"], sampling, cfg["seed"])
    jobs = [(s, t) for s in seeds for t in range(cfg["trials"])]
    import time

    t0 = time.monotonic()
    try:
        with Bar(len(jobs), f"eval {cfg['model']}") as bar:
            results = rollout(
                policy,
                lambda: make_env(cfg["env"], store=store),
                jobs,
                max_turns=sampling.max_turns,
                batch_size=cfg["batch_size"],
                on_done=lambda r: bar.advance(),
            )
    finally:
        if engine is not None and hasattr(engine, "close"):
            engine.close()  # the server keeps running without the adapter this eval loaded
    wall = time.monotonic() - t0
    episodes, calls, metas = _episode_rows(results, prepared)
    rows_for_summary = [
        {
            "task_id": e["task_id"],
            "task_family": e["task_family"],
            "seed": e["seed"],
            "success": e["success"],
            "reward": e["reward"],
        }
        for e in episodes
    ]
    summary, per_task = summarize(rows_for_summary, cfg["trials"])
    summary.update(_speed_and_truncation(results, wall, cfg["max_new_tokens"]))
    summary["engine"] = settings.engine
    with prepared.writer(store, "rollouts", name=name, overrides=overrides, replace=replace) as w:
        write_tables(w.path, episodes, calls)
        n_succ = sum(e["success"] for e in episodes)
        w.summary.update(
            {
                "episodes": len(episodes),
                "successes": n_succ,
                "failures": len(episodes) - n_succ,
                "tool_calls": len(calls),
                "env": str(cfg["env"]),
                "model": cfg["model"],
            }
        )
    rollouts_art = w.artifact
    with prepared.writer(store, "eval", name=name, overrides=overrides, replace=replace) as w:
        table_rows = [{**t, "pass_hat_k": json.dumps(t["pass_hat_k"])} for t in per_task]
        EVAL_RESULTS.write(table_rows, w.path)
        TASK_METADATA.write(list(metas.values()), w.path)
        w.summary.update(summary)
        w.summary["rollouts"] = rollouts_art.uri
    return {"rollouts": rollouts_art, "eval": w.artifact}


def engine_policy(settings, ref, sampling: SamplingSettings, seed: int):
    """(HFPolicy on the rollout engine, the engine) for a model or adapter reference (agents.engines)."""
    from trace_cli.agents.engines import open_engine
    from trace_cli.agents.hf import HFPolicy
    from trace_cli.models.importer import context_of, read_meta

    engine, model, tok = open_engine(settings, ref)
    policy = HFPolicy(
        model,
        tok,
        tool_format=read_meta(ref.path).get("tool_format"),
        max_context=context_of(model.config),
        name=ref.display,
        engine=engine,
        **sampling.policy_kwargs(),
        seed=seed,
    )
    return policy, engine


def _episode_rows(results: list[Any], prepared: Prepared):
    """(episodes, tool calls, task metadata by task id) of the rollout results, as the tables store them."""
    from trace_cli.store.rollouts import result_row

    episodes: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    metas: dict[str, dict[str, Any]] = {}
    for r in results:
        meta = r.metadata or {}
        ref = meta.get("reference_actions")
        info = {
            "policy": prepared.config["model"],
            "breakdown": r.breakdown,
            "gen_tokens": r.gen_tokens,
            "n_errors": r.n_errors,
            **(meta.get("episode_info") or {}),  # what the environment asks to keep per episode (τ²: task)
        }
        ep, rows = result_row(r, f"{r.task_id}-t{r.trial}", f"eval:{prepared.id}", info)
        episodes.append(ep)
        calls.extend(rows)
        metas[r.task_id] = {
            "task_id": r.task_id,
            "task_family": meta.get("family"),
            "seed": r.seed,
            "required_capabilities": json.dumps(meta.get("required_capabilities") or []),
            "reference_actions": None if ref is None else json.dumps(ref),
        }
    return episodes, calls, metas


def _speed_and_truncation(results: list[Any], wall: float, max_new_tokens: int) -> dict[str, Any]:
    """Throughput, and a warning when most turns ran out of new tokens (printed and kept in the summary)."""
    import sys

    out: dict[str, Any] = {}
    gen_tokens = sum(r.gen_tokens for r in results)
    out["wall_s"] = round(wall, 2)
    out["episodes_per_s"] = round(len(results) / wall, 3) if wall > 0 else None
    out["gen_tokens_per_s"] = round(gen_tokens / wall, 1) if wall > 0 else None
    turns = sum(r.n_actions for r in results)
    truncated = sum(r.n_truncated for r in results)
    out["truncated_turns"] = truncated
    if turns and truncated > turns / 2:
        # most turns ran out of tokens: the scores measure max_new_tokens, not the model (issue 12)
        msg = (
            f"{truncated} of {turns} turns hit max_new_tokens ({max_new_tokens}): raise --max-new-tokens, "
            "or check that the model stops (its stop tokens and chat template)"
        )
        out["warnings"] = [msg]
        print(f"warning: {msg}", file=sys.stderr)
    return out
