"""Stage `synthesize`: one seeded, verifiable, calibrated training environment for a diagnosed capability.

TRACE step 2. The environment is the capability's template (or an LLM-written module run in a sandbox) on the
target's tools: a registered environment's schemas, or schemas recovered from a rollouts artifact. It is
admitted only if it passes the checks (determinism, reference solver reward 1 on >= 100 seeds, a do-nothing
agent never succeeds, no answer in the opening messages, tool schemas equal to the target's) and calibration:
N seeds × K rollouts of the policy model land in band (mean success in [0.2, 0.6], <= 20 % all-0 groups,
<= 20 % all-1 groups); otherwise difficulty is adjusted and measured again, up to `max_attempts` times, and
the stage fails (exit 1) with the numbers of every attempt.

The stage only orchestrates: the target's tools (`envs.target.resolve_target`), the candidate (template, or the module
an LLM author writes: `envs.authoring`), the checks (`envs.synthetic.checks.admit`), calibration
(`envs.synthetic.calibrate`) and the artifact, whose files `envs.artifact` owns (environment.yaml,
calibration.parquet, samples.jsonl, module.py and modules/ for LLM authors).

A config without one capability fans out (`fan_out`): `trace synthesize` and recipe steps then run the stage
once per capability, listed or selected by the diagnosis (stages.base.execute_each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_cli.config.loading import load_artifact_yaml
from trace_cli.config.sampling import SamplingSettings
from trace_cli.errors import CheckFailed, UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store

NAME = "synthesize"
OUTPUTS = {"environment": "environment"}
FAN_OUT_FAILURE = "failed their checks or calibration"
CACHE_FAILURES = True  # a calibration out of band is remembered (stages.base): the same run fails at once


def fans_out(config: Any) -> bool:
    """Without one capability (none, or a list) the config asks for one environment per capability."""
    return not isinstance(config.get("capability"), str)


def fan_out(config: Any, store: Store) -> list[tuple[str, dict[str, Any]]]:
    """(capability, config) for each listed capability, or else each capability the diagnosis selected."""
    from trace_cli.config.frozen import thaw

    caps = list(config.get("capability") or [])
    if not caps:
        diag = store.resolve(config["diagnosis"], kind="diagnosis")
        doc = load_artifact_yaml(diag.path / "capabilities.yaml")
        caps = [c["name"] for c in doc.get("selected") or []]
        if not caps:
            raise UsageError(f"diagnosis {diag.uri} selects no capability; nothing to synthesize")
    return [(c, {**thaw(config), "capability": c}) for c in caps]


# ------------------------------------------------------------------------------------------------ target


def _seed_range(spec: str, what: str) -> tuple[int, int]:
    from trace_cli.config.seeds import check_seed_range

    a, b = (int(x) for x in spec.split(":"))
    check_seed_range(a, b, spec, f"seeds.{what}")
    return a, b


# ------------------------------------------------------------------------------------------------ prepare


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.synthetic import TEMPLATES, get_template
    from trace_cli.envs.target import resolve_target
    from trace_cli.models.refs import resolve_model

    cfg = checked_config(NAME, config)
    cap = cfg.get("capability")
    if not isinstance(cap, str):  # stages.base.execute_each runs one per capability (fan_out)
        raise UsageError("synthesize makes one environment a run: give it one capability")
    diag = store.resolve(cfg["diagnosis"], kind="diagnosis")
    doc = load_artifact_yaml(diag.path / "capabilities.yaml")
    selected = {c["name"]: c for c in doc.get("selected") or []}
    if cap not in selected:
        sel = ", ".join(selected) or "none"
        raise UsageError(f"capability {cap!r} is not selected by diagnosis {diag.uri}; selected: {sel}")
    if cfg["author"] == "template":
        get_template(cap)
    else:
        llm = cfg["llm"]
        if cfg["author"] == "openai" and not (llm.get("base_url") and llm.get("model")):
            raise UsageError(
                "the openai author needs llm.base_url and llm.model "
                "(e.g. --base-url http://127.0.0.1:8000/v1 --llm-model NAME)"
            )
        if cfg["author"] == "hf" and not llm.get("model"):
            raise UsageError("the hf author needs llm.model (a local model dir or store://model/NAME)")
    cal = cfg["calibration"]
    calibration_sampling(cfg)  # its cross-field check, before any compute
    _check_engine(cfg)
    if cal["band"][0] > cal["band"][1]:
        raise UsageError(f"calibration.band {cal['band']} is empty: low must not exceed high")
    train = _seed_range(cfg["seeds"]["train"], "train")
    ev = _seed_range(cfg["seeds"]["eval"], "eval")
    if train[0] < ev[1] and ev[0] < train[1]:
        raise UsageError(
            f"seeds: the train range {cfg['seeds']['train']} overlaps the held-out eval range "
            f"{cfg['seeds']['eval']}"
        )
    if train[1] - train[0] < cal["seeds"]:
        raise UsageError(
            f"calibration.seeds ({cal['seeds']}) is more than the train range {cfg['seeds']['train']} holds"
        )
    target = resolve_target(cfg["target"], store)
    if cfg["tools"] == "needed":
        if cfg["author"] != "template":
            raise UsageError("tools: needed keeps the template's own tool list; it needs author: template")
        from trace_cli.envs.worlds import get_world
        from trace_cli.envs.worlds.tasks import HANDOFF

        # the template's tools, and the target's hand-off to a human, which every target task offers last
        world = get_world(target["world"])
        needed = {*(world.tool_for(n) for n in TEMPLATES[cap].TOOLS), HANDOFF}
        target = {**target, "tools": {n: t for n, t in target["tools"].items() if n in needed}}
    model = resolve_model(cfg["model"], store)
    shape = None
    if cap in TEMPLATES:  # validate the difficulty parameters now, before any compute
        TEMPLATES[cap](
            tools=target["tools"], max_turns=cfg["max_turns"], world=target["world"], **cfg["params"]
        )
        shape = _shape(cfg, diag, store, TEMPLATES[cap], target)
    id_config = {**cfg, "diagnosis": diag.id, "model": model.digest, "target": target["identity"]}
    if target["world"] != "shop":  # the world's data and generator (shop ids stay as they were)
        id_config["world"] = _world_identity(target["world"])
    _engine_id(id_config)
    inputs = [diag.as_input("diagnosis"), model.as_input("model")] + target["inputs"]
    p = Prepared(NAME, cfg, id_config, inputs, dict(OUTPUTS)).finalize()
    p.extra.update(
        diagnosis=diag, diagnosis_doc=doc, capability=selected[cap], target=target, model=model, train=train
    )
    p.extra["shape"] = shape
    return p


def _shape(cfg: dict[str, Any], diag, store: Store, template, target) -> dict[str, Any] | None:
    """The template's pins from the diagnosis's LACKING conversations (`envs.synthetic.shaping`), or None."""
    from trace_cli.compose.needs import diagnosed, diagnosed_rollouts
    from trace_cli.envs.synthetic.shaping import shape_for

    rollouts = diagnosed_rollouts(diag, store) if cfg["shape_min_tasks"] else None
    if rollouts is None:
        return None
    lacking = [ep for ep, slot in diagnosed(diag, rollouts, [cfg["capability"]]) if slot]
    kw = {"tools": target["tools"], "max_turns": cfg["max_turns"], "world": target["world"]}
    return shape_for(template, lacking, cfg["shape_min_tasks"], cfg["params"], **kw)


# ------------------------------------------------------------------------------------------------ run


def _check_engine(cfg: dict[str, Any]) -> None:
    """The `rollout` block: its cross-field rule, and a server that answers (exit 2 before any compute)."""
    from trace_cli.agents.engines import RolloutSettings

    settings = RolloutSettings.of(cfg["rollout"])
    settings.check()
    if settings.engine == "server":
        settings.server().check()


def _engine_id(id_config: dict[str, Any]) -> None:
    """Only the engine enters the id, and the default (hf) nothing: ids from before the engine seam stay."""
    from trace_cli.agents.engines import id_part

    part = id_part(id_config.pop("rollout"))
    if part:
        id_config["rollout"] = part


def load_calibration_policy(model, store: Store, cfg: dict[str, Any]):
    """The policy that calibrates (loaded once per run; each attempt reseeds it). A model with
    `calibration.tokens` samples as GRPO does (agents.token_history.TokenPolicy), so the episodes of the admitted
    attempt are on-policy rollouts of GRPO's first step and can be reused as such. It generates on the run's
    rollout engine (`rollout`: agents.engines)."""
    from trace_cli.compose.policy import load_policy

    sampling = calibration_sampling(cfg)
    if cfg["rollout"]["engine"] != "hf":
        return _engine_calibration_policy(model, cfg, sampling)
    if cfg["calibration"]["tokens"] and model.kind == "hf":
        from trace_cli.agents.token_history import TokenPolicy
        from trace_cli.models import device
        from trace_cli.models.importer import context_of
        from trace_cli.models.refs import load_hf

        hf, tok = load_hf(model)
        cache = device.prefix_cache(
            hf
        )  # the calibration's weights never change: one cache for all its episodes
        # synthesize.v1.json has no top_k: calibration samples without a top-k cut (0 = off)
        kw = {"top_k": 0, "seed": cfg["seed"], "prefix_cache": cache}
        return TokenPolicy.sampling_as(hf, tok, sampling, max_context=context_of(hf.config), **kw)
    return load_policy(model, **sampling.policy_kwargs(), seed=cfg["seed"])


def _engine_calibration_policy(model, cfg: dict[str, Any], sampling: SamplingSettings):
    """The calibration policy on a vllm or server engine: GRPO's token sampler (`calibration.tokens`) or the
    eval policy, on a model whose weights live in the engine."""
    from trace_cli.agents.engines import RolloutSettings, open_engine
    from trace_cli.agents.hf import HFPolicy
    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.models.importer import context_of, read_meta

    engine, served, tok = open_engine(RolloutSettings.of(cfg["rollout"]), model)
    ctx = context_of(served.config)
    if cfg["calibration"]["tokens"] and model.kind == "hf":
        kw = {"top_k": 0, "seed": cfg["seed"], "engine": engine}
        return TokenPolicy.sampling_as(served, tok, sampling, max_context=ctx, **kw)
    meta = read_meta(model.path)
    return HFPolicy(
        served,
        tok,
        tool_format=meta.get("tool_format"),
        max_context=ctx,
        name=model.display,
        engine=engine,
        **sampling.policy_kwargs(),
        seed=cfg["seed"],
    )


def calibration_sampling(cfg: dict[str, Any]) -> SamplingSettings:
    """How calibration samples: the `calibration` block's settings and the episode's `max_turns`."""
    return SamplingSettings.of(cfg["calibration"], max_turns=cfg["max_turns"])


@dataclass
class Candidate:
    """What is checked and calibrated: the capability's template, or the module an LLM author wrote."""

    factory_for: Callable[[dict[str, Any]], Callable[[], Any]]  # params -> environment factory
    params: dict[str, Any]  # where calibration starts
    harder: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None  # a module has no steps
    easier: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None
    module_src: str | None = None
    modules: list[dict[str, Any]] = field(default_factory=list)  # every module the author wrote
    fallback: str | None = None  # "template" when every authored module was rejected
    workers: list[Any] = field(default_factory=list)  # sandbox workers of the module, closed at the end


def _candidate(cfg: dict[str, Any], store: Store, prepared: Prepared, limits: Any) -> Candidate:
    from trace_cli.envs.authoring import author_module, module_params
    from trace_cli.envs.sandbox import module_env_factory
    from trace_cli.envs.synthetic import TEMPLATES

    cap, target = cfg["capability"], prepared.extra["target"]
    module_src, modules, fallback = None, [], None
    if cfg["author"] != "template":
        module_src, modules, fallback = author_module(
            cfg,
            store,
            capability_doc=prepared.extra["capability"],
            diagnosis_doc=prepared.extra["diagnosis_doc"],
            target=target,
            limits=limits,
            has_template=cap in TEMPLATES,
        )
    if module_src is None:
        cls = TEMPLATES[cap]
        return Candidate(
            lambda params: (
                lambda: cls(
                    tools=target["tools"], max_turns=cfg["max_turns"], world=target["world"], **params
                )
            ),
            {
                "level": cls.DEFAULT_LEVEL,
                **(prepared.extra["shape"] or {}).get("params", {}),
                **cfg["params"],
            },
            cls.harder,
            cls.easier,
            modules=modules,
            fallback=fallback,
        )
    workers: list[Any] = []

    def factory_for(params: dict[str, Any]):
        f = module_env_factory(
            module_src, module_params(params, target), limits, unsafe_local_exec=cfg["unsafe_local_exec"]
        )
        workers.append(f)
        return f

    return Candidate(
        factory_for, dict(cfg["params"]), module_src=module_src, modules=modules, workers=workers
    )


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.envs.sandbox import Limits

    cfg = prepared.config
    limits = Limits.of(cfg["sandbox"])
    cand = _candidate(cfg, store, prepared, limits)
    try:
        return _calibrate_and_write(
            prepared, store, cand, limits, name=name, overrides=overrides, replace=replace
        )
    finally:
        for f in cand.workers:
            f.close()


def _calibrate_and_write(
    prepared: Prepared, store: Store, cand: Candidate, limits: Any, *, name, overrides, replace
) -> dict[str, Artifact]:
    from trace_cli.envs import artifact
    from trace_cli.envs.synthetic.calibrate import calibrate_as_configured, failure
    from trace_cli.envs.synthetic.checks import admit
    from trace_cli.progress import Bar

    cfg = prepared.config
    cap, target, t0 = cfg["capability"], prepared.extra["target"], prepared.extra["train"][0]
    cal_cfg = cfg["calibration"]

    def gate(params: dict[str, Any]) -> list[dict[str, Any]]:
        fallback_ok = target["kind"] == "env" or cand.module_src is None
        checks = {
            k: cfg["checks"][k]
            for k in ("reference_seeds", "determinism_seeds", "do_nothing_seeds", "leakage_seeds")
        }
        return admit(
            cand.factory_for(params), cap, target["tools"], fallback_ok=fallback_ok, seeds=checks, start=t0
        )

    checks = gate(cand.params)
    policy = load_calibration_policy(prepared.extra["model"], store, cfg)
    cal = calibrate_as_configured(
        cal_cfg,
        policy,
        seed=cfg["seed"],
        start=t0,
        max_turns=cfg["max_turns"],
        factory_for=cand.factory_for,
        params=cand.params,
        harder=cand.harder,
        easier=cand.easier,
        progress=lambda i, total: Bar(total, f"calibrate {cap} (attempt {i})"),
    )
    attempts = [a.to_dict() for a in cal.attempts]
    if not cal.passed:
        err = CheckFailed(failure(cap, cal, cal_cfg))
        err.details = {
            "capability": cap,
            "checks": checks,
            "attempts": attempts,
            "rollouts_run": cal.rollouts_run,
            "model": cfg["model"],
        }
        raise err
    if cal.params != cand.params:
        checks = gate(cal.params)  # the difficulty that was admitted is the one that is checked
    env = cand.factory_for(cal.params)()
    obs = env.reset(t0)
    final_params = dict(getattr(env, "params", cal.params))
    doc = artifact.checked(_document(prepared, cand, env, obs, final_params, checks, attempts, limits))
    with prepared.writer(store, "environment", name=name, overrides=overrides, replace=replace) as w:
        artifact.write_environment(
            w.path,
            doc,
            attempts=attempts,
            episodes=artifact.samples(cal.results, cfg["samples"]),
            module_src=cand.module_src,
            modules=cand.modules,
        )
        kept = _keep_token_rollouts(w.path, cal.results, policy, prepared)
        if kept:
            w.summary["calibration_rollouts"] = kept
        w.summary.update(_summary(doc, final_params, obs, target, cal))
    return {"environment": w.artifact}


def _summary(doc: dict[str, Any], params: dict[str, Any], obs, target: dict[str, Any], cal) -> dict[str, Any]:
    """The environment artifact's summary: what it is and how its last calibration attempt did."""
    last = cal.attempts[-1]
    return {
        "capability": doc["capability"],
        "name": doc["name"],
        "source": doc["source"],
        "params": params,
        "tools": [t["function"]["name"] for t in obs.tools],
        "target": target["ref"],
        "checks_passed": True,
        "calibration_attempts": len(cal.attempts),
        "mean_success": last.mean_success,
        "mean_reward": last.mean_reward,
        "frac_all0": last.frac_all0,
        "frac_all1": last.frac_all1,
        "frac_constant_low": last.frac_constant_low,  # constant-reward groups below 1 (the band's)
        "hint_share": last.hint_share,
        "mean_success_unhinted": last.mean_success_unhinted,
        "seeds_train": doc["seeds"]["train"],
        "seeds_eval": doc["seeds"]["eval"],
    }


def _keep_token_rollouts(path, results: list[Any], policy: Any, prepared: Prepared) -> dict[str, Any] | None:
    """The admitted attempt's episodes as GRPO token sequences (calibration_rollouts.parquet), with the settings
    they were sampled with (train's reuse_calibration checks them); None for a policy that keeps no tokens."""
    from trace_cli.agents.token_history import episode_sequence
    from trace_cli.envs.artifact import CALIBRATION_ROLLOUTS, write_calibration_rollouts

    eos = getattr(policy, "eos_id", None)
    if eos is None or not results or not all(r.turns or r.n_actions == 0 for r in results):
        return None
    rows = []
    for r in sorted(results, key=lambda r: (r.seed, r.trial)):
        seq = episode_sequence(r.turns, eos)
        rows.append(
            {
                "seed": r.seed,
                "trial": r.trial,
                "reward": float(r.reward),
                "success": bool(r.success),
                "n_actions": int(r.n_actions),
                "termination": str(r.termination),
                **{k: seq[k] for k in ("prompt_ids", "completion_ids", "env_mask")},
            }
        )
    write_calibration_rollouts(path, rows)
    cfg = prepared.config
    return {
        "file": CALIBRATION_ROLLOUTS,
        "episodes": len(rows),
        "seeds": len({r["seed"] for r in rows}),
        "rollouts": cfg["calibration"]["rollouts"],
        **calibration_sampling(cfg).reuse_key(prepared.extra["model"].digest),
    }


def _world_identity(name: str) -> dict[str, Any]:
    """What environment.yaml records of the world (envs.worlds): its name, and for a packaged world the
    generator's version and the package's data fingerprint (loading checks them)."""
    from trace_cli.envs.worlds import get_world

    return get_world(name).identity()


def _document(prepared, cand: Candidate, env, obs, params, checks, attempts, limits) -> dict[str, Any]:
    """environment.yaml of the admitted environment (schema environment.v1.json)."""
    from trace_cli.envs.artifact import MODULE_FILE

    cfg, target = prepared.config, prepared.extra["target"]
    cap, cal_cfg = cfg["capability"], cfg["calibration"]
    used = [t["function"]["name"] for t in obs.tools]
    doc: dict[str, Any] = {
        "kind": "environment",
        "version": 1,
        "name": str(getattr(env, "name", cap)),
        "capability": cap,
        "description": " ".join(str(prepared.extra["capability"].get("description", "")).split()),
        "diagnosis": prepared.extra["diagnosis"].uri,
        "source": "template" if cand.module_src is None else "module",
        "params": params,
        "max_turns": cfg["max_turns"],
        "policy": target["world"],
        "world": _world_identity(target["world"]),
        "tools": obs.tools,
        "tool_sources": dict(getattr(env, "tool_sources", {})) or {n: "module" for n in used},
        "target": {
            "kind": target["kind"],
            "ref": target["ref"],
            "tools": sorted(target["tools"]),
            "missing": [n for n in used if n not in target["tools"]],
            **({"artifact": target["artifact"]} if target["artifact"] else {}),
        },
        "seeds": {
            "train": cfg["seeds"]["train"].replace(" ", ""),
            "eval": cfg["seeds"]["eval"].replace(" ", ""),
        },
        "checks": {c["name"]: {k: c[k] for k in ("passed", "seeds", "message", "details")} for c in checks},
        "calibration": {
            "model": cfg["model"],
            "seeds": cal_cfg["seeds"],
            "rollouts": cal_cfg["rollouts"],
            "temperature": cal_cfg["temperature"],
            "band": list(cal_cfg["band"]),
            "max_group_all0": cal_cfg["max_group_all0"],
            "max_group_all1": cal_cfg["max_group_all1"],
            "passed": True,
            "attempts": attempts,
        },
        "authoring": {"author": cfg["author"]},
    }
    if prepared.extra.get("shape") is not None:
        doc["shaped_by"] = prepared.extra["shape"]
    if cand.module_src is None:
        doc["template"] = cap
    else:
        doc["module"] = MODULE_FILE
    if cfg["author"] != "template":
        from trace_cli.envs.authoring import prescreen_seeds

        doc["authoring"].update(
            model=str(cfg["llm"].get("model")),
            sandbox=limits.to_dict(),
            prescreen=prescreen_seeds(cfg["checks"]),
            modules=[{k: m[k] for k in ("file", "accepted", "reason")} for m in cand.modules],
        )
        if cand.fallback:
            doc["authoring"]["fallback"] = cand.fallback
    return doc
