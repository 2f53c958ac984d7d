"""Stage `synthesize`: one seeded, verifiable, calibrated training environment for a diagnosed capability.

TRACE step 2. The environment is the capability's template (or an LLM-written module run in a sandbox) on the
target's tools: a registered environment's schemas, or schemas recovered from a rollouts artifact. It is
admitted only if it passes the checks (determinism, reference solver reward 1 on >= 100 seeds, a do-nothing
agent never succeeds, no answer in the opening messages, tool schemas equal to the target's) and calibration:
N seeds × K rollouts of the policy model land in band (mean success in [0.2, 0.6], <= 20 % all-0 groups,
<= 20 % all-1 groups); otherwise difficulty is adjusted and measured again, up to `max_attempts` times, and
the stage fails (exit 1) with the numbers of every attempt.

Output: an `environment` artifact: environment.yaml (schema environment.v1.json), calibration.parquet (view
`calibration`, one row per attempt), samples.jsonl (episodes from the last attempt), and for LLM authors
the accepted module (module.py) plus every rejected one (modules/) with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from trace_cli.config.loading import load_artifact_yaml
from trace_cli.config.schemas import validate
from trace_cli.errors import CheckFailed, NotFoundError, UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import CALIBRATION

NAME = "synthesize"
OUTPUTS = {"environment": "environment"}
ENV_FILE = "environment.yaml"
SAMPLES_FILE = "samples.jsonl"
MODULE_FILE = "module.py"
MODULES_DIR = "modules"

CALIBRATION_FILE, CALIBRATION_SCHEMA = CALIBRATION.file, CALIBRATION.schema


# ------------------------------------------------------------------------------------------------ target


def _seed_range(spec: str, what: str) -> tuple[int, int]:
    from trace_cli.stages.eval import check_seed_range

    a, b = (int(x) for x in spec.split(":"))
    check_seed_range(a, b, spec, f"seeds.{what}")
    return a, b


def resolve_target(ref: Any, store: Store) -> dict[str, Any]:
    """{"kind": env|rollouts, "ref", "tools": {name: schema}, "identity", "inputs", "artifact"}."""
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import list_envs, make_env, parse_env_ref
    from trace_cli.envs.synthetic import recover_tools

    def from_rollouts(art: Artifact) -> dict[str, Any]:
        tools = recover_tools(art)
        if not tools:
            raise UsageError(
                f"target {art.uri}: its episodes have no tool definitions and no tool calls to recover "
                "tools from"
            )
        return {
            "kind": "rollouts",
            "ref": art.uri,
            "tools": tools,
            "identity": {"rollouts": art.id},
            "inputs": [art.as_input("target")],
            "artifact": art.uri,
        }

    if isinstance(ref, str) and (ref.startswith("store://") or ref.split("/", 1)[0] in ("rollouts",)):
        art = store.resolve(ref)
        if art.kind != "rollouts":
            raise UsageError(
                f"target {ref!r} is a {art.kind} artifact; expected a registered environment "
                "(e.g. shop) or a rollouts artifact"
            )
        return from_rollouts(art)
    name, _ = parse_env_ref(ref)
    if name not in list_envs():
        try:
            return from_rollouts(store.resolve(name, kind="rollouts"))
        except NotFoundError:
            raise NotFoundError(
                f"target {ref!r} is neither a registered environment ({', '.join(list_envs())}) "
                "nor a rollouts artifact in the store"
            ) from None
    env = make_env(ref)
    tools: dict[str, Any] = {}
    for seed in range(24):  # the union of the tools the target exposes over its task families
        for t in env.reset(seed).tools:
            tools.setdefault(t["function"]["name"], t)
    ident = env_identity(ref)
    return {
        "kind": "env",
        "ref": ref if isinstance(ref, str) else json.dumps(ref, sort_keys=True),
        "tools": dict(sorted(tools.items())),
        "identity": ident["id"],
        "inputs": ident["inputs"],
        "artifact": None,
    }


# ------------------------------------------------------------------------------------------------ prepare


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.synthetic import TEMPLATES, get_template
    from trace_cli.models.refs import resolve_model

    cfg = checked_config(NAME, config)
    cap = cfg["capability"]
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
    model = resolve_model(cfg["model"], store)
    if cap in TEMPLATES:  # validate the difficulty parameters now, before any compute
        TEMPLATES[cap](tools=target["tools"], max_turns=cfg["max_turns"], **cfg["params"])
    id_config = {**cfg, "diagnosis": diag.id, "model": model.digest, "target": target["identity"]}
    inputs = [diag.as_input("diagnosis"), model.as_input("model")] + target["inputs"]
    p = Prepared(NAME, cfg, id_config, inputs, dict(OUTPUTS)).finalize()
    p.extra.update(
        diagnosis=diag, diagnosis_doc=doc, capability=selected[cap], target=target, model=model, train=train
    )
    return p


# ------------------------------------------------------------------------------------------------ pieces


def load_calibration_policy(model, store: Store, cfg: dict[str, Any]):
    """The policy that calibrates (loaded once per run; each attempt reseeds it)."""
    from trace_cli.compose.policy import load_policy

    cal = cfg["calibration"]
    return load_policy(
        model,
        temperature=cal["temperature"],
        top_p=cal["top_p"],
        max_new_tokens=cal["max_new_tokens"],
        seed=cfg["seed"],
    )


def _reseed(policy: Any, seed: int) -> Any:
    if hasattr(policy, "seed"):
        policy.seed = seed
    if hasattr(policy, "_round"):
        policy._round = 0
    return policy


def check_tools(env, target_tools: dict[str, Any], *, fallback_ok: bool) -> dict[str, Any]:
    """Every tool the environment exposes equals the target's (name + parameters), or is an allowed fallback."""
    from trace_cli.envs.shop import TOOL_SCHEMAS

    obs = env.reset(0)
    bad, missing = [], []
    for t in obs.tools:
        fn = t.get("function", {})
        name = fn.get("name")
        if name in target_tools:
            want = target_tools[name]["function"]
            if (fn.get("name"), fn.get("parameters")) != (want["name"], want.get("parameters")):
                bad.append(f"{name}: the argument schema differs from the target's")
        elif (
            fallback_ok
            and name in TOOL_SCHEMAS
            and fn.get("parameters") == TOOL_SCHEMAS[name]["function"]["parameters"]
        ):
            missing.append(name)
        else:
            bad.append(f"{name}: not a tool of the target")
    msg = (
        (
            f"{len(obs.tools)} tools equal the target's"
            + (f" ({len(missing)} shop fallbacks: {', '.join(missing)})" if missing else "")
        )
        if not bad
        else "; ".join(bad)
    )
    return {
        "name": "tools",
        "passed": not bad,
        "seeds": 1,
        "message": msg,
        "details": {
            "tools": [t["function"]["name"] for t in obs.tools],
            "fallbacks": missing,
            "problems": bad,
        },
    }


def _examples(store: Store, diag_doc: dict[str, Any], cap_doc: dict[str, Any], n: int = 3) -> list[str]:
    """Transcripts of a few failed episodes the diagnosis cites for the capability."""
    from trace_cli.envs.synthetic.author import transcript
    from trace_cli.store.rollouts import read_episodes

    try:
        art = store.resolve(diag_doc["rollouts"], kind="rollouts")
        eps = read_episodes(art.path)
    except (UsageError, KeyError, OSError):
        return []
    want = [str(t) for t in cap_doc.get("example_failed_task_ids") or []]
    out = []
    for tid in want:
        ep = next((e for e in eps if str(e["task_id"]) == tid and not e["success"]), None)
        if ep is not None:
            out.append(transcript(ep))
        if len(out) >= n:
            break
    return out


def _author(
    cfg: dict[str, Any], store: Store, prepared: Prepared, limits
) -> tuple[str | None, list[dict[str, Any]]]:
    """Ask the LLM for modules until one passes the sandboxed checks; every attempt is logged."""
    from trace_cli.envs.sandbox import check_module, isolation

    isolation(cfg["unsafe_local_exec"])  # no OS sandbox and no explicit consent: exit 2 before any request
    from trace_cli.envs.synthetic.author import author_messages, write_module

    cap = cfg["capability"]
    cap_doc = prepared.extra["capability"]
    target = prepared.extra["target"]
    examples = _examples(store, prepared.extra["diagnosis_doc"], cap_doc)
    llm = {k: v for k, v in cfg["llm"].items() if k not in ("attempts", "fallback")}
    chk = cfg["checks"]
    log: list[dict[str, Any]] = []
    feedback = None
    for attempt in range(1, cfg["llm"]["attempts"] + 1):
        msgs = author_messages(
            cap, cap_doc["description"], list(target["tools"].values()), examples, feedback
        )
        src, why = write_module(cfg["author"], llm, store, msgs, seed=cfg["seed"], attempt=attempt)
        if src is None:
            log.append({"file": None, "accepted": False, "reason": f"no usable module: {why}"})
            feedback = why
            continue
        verdict = check_module(
            src,
            cfg["params"],
            limits,
            reference_seeds=chk["reference_seeds"],
            determinism_seeds=min(chk["determinism_seeds"], 10),
            do_nothing_seeds=min(chk["do_nothing_seeds"], 50),
            leakage_seeds=min(chk["leakage_seeds"], 50),
            unsafe_local_exec=cfg["unsafe_local_exec"],
        )
        entry = {
            "file": f"{MODULES_DIR}/attempt-{attempt}.py",
            "accepted": verdict.accepted,
            "reason": verdict.reason,
            "source": src,
        }
        if verdict.accepted:
            from trace_cli.envs.sandbox import SandboxedEnv, SandboxWorker

            with SandboxWorker(src, limits, unsafe_local_exec=cfg["unsafe_local_exec"]) as w:
                tc = check_tools(
                    SandboxedEnv(w, cfg["params"]), target["tools"], fallback_ok=target["kind"] == "env"
                )
            if not tc["passed"]:
                entry.update(accepted=False, reason=f"check tools failed: {tc['message']}")
        log.append(entry)
        if entry["accepted"]:
            return src, log
        if entry["reason"].startswith("blocked:"):  # a forbidden action: stop asking this author (see run())
            break
        feedback = entry["reason"]
    return None, log


def _fail_message(cap: str, cal, band: dict[str, Any]) -> str:
    b = band
    return (
        f"calibration of {cap} failed after {len(cal.attempts)} attempt(s): the policy's success must be in "
        f"[{b['band'][0]}, {b['band'][1]}] with <= {b['max_group_all0']:.0%} all-0 and <= "
        f"{b['max_group_all1']:.0%} all-1 groups\n{cal.summary()}"
    )


# ------------------------------------------------------------------------------------------------ run


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.envs.sandbox import Limits, module_env_factory
    from trace_cli.envs.synthetic import TEMPLATES
    from trace_cli.envs.synthetic.checks import run_checks

    cfg = prepared.config
    cap = cfg["capability"]
    target = prepared.extra["target"]
    chk = cfg["checks"]
    sb = cfg["sandbox"]
    limits = Limits(
        cpu_s=float(sb["cpu_s"]), memory_mb=int(sb["memory_mb"]), timeout_s=float(sb["timeout_s"])
    )
    modules: list[dict[str, Any]] = []
    factories: list[Any] = []  # sandbox workers of a module, closed at the end
    module_src: str | None = None
    fallback = None
    if cfg["author"] != "template":
        module_src, modules = _author(cfg, store, prepared, limits)
        blocked = [(i + 1, m["reason"]) for i, m in enumerate(modules) if m["reason"].startswith("blocked:")]
        if blocked:
            # A module that tried something the sandbox forbids (files outside its directory, processes, the
            # network, introspection) means the authoring channel is not trustworthy (the prompt embeds
            # third-party rollout text): no fallback, no later attempt, nothing stored.
            i, why = blocked[0]
            err = CheckFailed(
                f"attempt {i} of the {cfg['author']} author wrote a module for {cap} that tried a forbidden action "
                f"({why}); refusing to store any environment from this author run"
            )
            err.details = {
                "capability": cap,
                "modules": [{k: v for k, v in m.items() if k != "source"} for m in modules],
            }
            raise err
        if module_src is None:
            reasons = "; ".join(f"attempt {i + 1}: {m['reason']}" for i, m in enumerate(modules))
            if cfg["llm"]["fallback"] == "template" and cap in TEMPLATES:
                fallback = "template"
            else:
                err = CheckFailed(
                    f"every module the {cfg['author']} author wrote for {cap} was rejected ({reasons})"
                )
                err.details = {
                    "capability": cap,
                    "modules": [{k: v for k, v in m.items() if k != "source"} for m in modules],
                }
                raise err
    if module_src is None:
        cls = TEMPLATES[cap]

        def factory_for(params: dict[str, Any]):
            return lambda: cls(tools=target["tools"], max_turns=cfg["max_turns"], **params)

        harder, easier = cls.harder, cls.easier
        params0 = {"level": cls.DEFAULT_LEVEL, **cfg["params"]}
    else:

        def factory_for(params: dict[str, Any]):
            f = module_env_factory(module_src, params, limits, unsafe_local_exec=cfg["unsafe_local_exec"])
            factories.append(f)
            return f

        harder = easier = lambda p: None  # noqa: E731 - a module has no difficulty steps
        params0 = dict(cfg["params"])

    def gate(params: dict[str, Any]) -> list[dict[str, Any]]:
        f = factory_for(params)
        results = [
            r.to_dict()
            for r in run_checks(
                f,
                reference_seeds=chk["reference_seeds"],
                determinism_seeds=chk["determinism_seeds"],
                do_nothing_seeds=chk["do_nothing_seeds"],
                leakage_seeds=chk["leakage_seeds"],
                start=prepared.extra["train"][0],
            )
        ]
        results.append(
            check_tools(f(), target["tools"], fallback_ok=target["kind"] == "env" or module_src is None)
        )
        failed = [r for r in results if not r["passed"]]
        if failed:
            err = CheckFailed(f"{cap}: check {failed[0]['name']} failed: {failed[0]['message']}")
            err.details = {"capability": cap, "checks": results}
            raise err
        return results

    try:
        return _calibrate_and_write(
            prepared,
            store,
            name,
            overrides,
            replace,
            factory_for,
            gate,
            harder,
            easier,
            params0,
            module_src,
            modules,
            fallback,
            limits,
        )
    finally:
        for f in factories:
            f.close()


def _calibrate_and_write(
    prepared,
    store,
    name,
    overrides,
    replace,
    factory_for,
    gate,
    harder,
    easier,
    params0,
    module_src,
    modules,
    fallback,
    limits,
) -> dict[str, Artifact]:
    from trace_cli.envs.synthetic.calibrate import Band, calibrate
    from trace_cli.progress import Bar

    cfg = prepared.config
    cap = cfg["capability"]
    target = prepared.extra["target"]
    cal_cfg = cfg["calibration"]
    checks = gate(params0)
    policy = load_calibration_policy(prepared.extra["model"], store, cfg)
    t0 = prepared.extra["train"][0]
    band = Band(cal_cfg["band"][0], cal_cfg["band"][1], cal_cfg["max_group_all0"], cal_cfg["max_group_all1"])
    cal = calibrate(
        factory_for=factory_for,
        params=params0,
        policy_for=lambda attempt: _reseed(policy, cfg["seed"] * 1000 + attempt),
        seeds=list(range(t0, t0 + cal_cfg["seeds"])),
        rollouts=cal_cfg["rollouts"],
        band=band,
        max_attempts=cal_cfg["max_attempts"],
        harder=harder,
        easier=easier,
        max_turns=cfg["max_turns"],
        batch_size=cal_cfg["batch_size"],
        progress=lambda i, total: Bar(total, f"calibrate {cap} (attempt {i})"),
    )
    attempts = [a.to_dict() for a in cal.attempts]
    if not cal.passed:
        err = CheckFailed(_fail_message(cap, cal, cal_cfg))
        err.details = {"capability": cap, "checks": checks, "attempts": attempts}
        raise err
    if cal.params != params0:
        checks = gate(cal.params)  # the difficulty that was admitted is the one that is checked
    env = factory_for(cal.params)()
    obs = env.reset(t0)
    final_params = dict(getattr(env, "params", cal.params))
    tool_sources = dict(getattr(env, "tool_sources", {})) or {
        t["function"]["name"]: "module" for t in obs.tools
    }
    used = [t["function"]["name"] for t in obs.tools]
    doc: dict[str, Any] = {
        "kind": "environment",
        "version": 1,
        "name": str(getattr(env, "name", cap)),
        "capability": cap,
        "description": " ".join(str(prepared.extra["capability"].get("description", "")).split()),
        "diagnosis": prepared.extra["diagnosis"].uri,
        "source": "template" if module_src is None else "module",
        "params": final_params,
        "max_turns": cfg["max_turns"],
        "policy": "shop",
        "tools": obs.tools,
        "tool_sources": tool_sources,
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
    if module_src is None:
        doc["template"] = cap
    else:
        doc["module"] = MODULE_FILE
    if cfg["author"] != "template":
        doc["authoring"].update(
            model=str(cfg["llm"].get("model")),
            sandbox=limits.to_dict(),
            modules=[{k: m[k] for k in ("file", "accepted", "reason")} for m in modules],
        )
        if fallback:
            doc["authoring"]["fallback"] = fallback
    doc = json.loads(json.dumps(doc, default=str))  # plain YAML types only (tuples, numpy floats ...)
    validate(doc, "environment.v1.json", source=ENV_FILE)
    samples = _samples(cal.results, cfg["samples"])
    with prepared.writer(store, "environment", name=name, overrides=overrides, replace=replace) as w:
        (w.path / ENV_FILE).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
        rows = [
            {
                "capability": cap,
                **{k: a[k] for k in CALIBRATION_SCHEMA.names if k not in ("capability", "params")},
                "params": json.dumps(a["params"], sort_keys=True),
            }
            for a in attempts
        ]
        pq.write_table(pa.Table.from_pylist(rows, schema=CALIBRATION_SCHEMA), w.path / CALIBRATION_FILE)
        with open(w.path / SAMPLES_FILE, "w", encoding="utf-8") as fh:
            for s in samples:
                fh.write(json.dumps(s, ensure_ascii=False, default=str) + "\n")
        if module_src is not None:
            (w.path / MODULE_FILE).write_text(module_src, encoding="utf-8")
        for m in modules:
            if m.get("file") and m.get("source") is not None:
                p = w.path / m["file"]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(m["source"], encoding="utf-8")
        last = cal.attempts[-1]
        w.summary.update(
            {
                "capability": cap,
                "name": doc["name"],
                "source": doc["source"],
                "params": final_params,
                "tools": used,
                "target": target["ref"],
                "checks_passed": True,
                "calibration_attempts": len(cal.attempts),
                "mean_success": last.mean_success,
                "mean_reward": last.mean_reward,
                "frac_all0": last.frac_all0,
                "frac_all1": last.frac_all1,
                "seeds_train": doc["seeds"]["train"],
                "seeds_eval": doc["seeds"]["eval"],
            }
        )
    return {"environment": w.artifact}


def _samples(results: list[Any], n: int) -> list[dict[str, Any]]:
    """Up to n episodes: successes and failures alternating, so both kinds are there to read."""
    ok = [r for r in results if r.success]
    bad = [r for r in results if not r.success]
    picked: list[Any] = []
    while len(picked) < n and (ok or bad):
        for pool in (ok, bad):
            if pool and len(picked) < n:
                picked.append(pool.pop(0))
    return [
        {
            "task_id": r.task_id,
            "seed": r.seed,
            "trial": r.trial,
            "reward": r.reward,
            "success": r.success,
            "termination": r.termination,
            "components": r.breakdown.get("components"),
            "variant": (r.metadata or {}).get("variant"),
            "messages": r.messages,
        }
        for r in picked
    ]


def read_environment(art: Artifact) -> dict[str, Any]:
    return load_artifact_yaml(Path(art.path / ENV_FILE))
