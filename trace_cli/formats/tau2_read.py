"""τ²-bench results (`Results`: info, tasks, simulations; one JSON file or a run directory) -> episode rows.

The inverse of `formats.tau2` (export). Every problem names the run and the field; runs τ²-bench leaves out of
its metrics (infrastructure errors, no reward) are excluded (`RecordError.excluded`), not failed. Trials are
numbered per task when τ²-bench leaves them null; a missing task id is taken from the run's task, the file's
simulation_index or its only task, else derived from the first user message. The policy becomes the system
message, reasoning stays on its message, costs and timestamps go to `info`. What τ²-bench wrote is kept in
`info.tau2` (each run's fields, per message what export would not write the same, and on the first run the
file's `info`, `tasks`, top-level fields and excluded runs), so `trace export tau2` writes the file back as it
was. Parsing is orjson's with `json` as the exact fallback (see `formats.codec`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from trace_cli.errors import InputError
from trace_cli.formats.codec import (
    NOT_PARSED,
    Inexact,
    Parsed,
    RecordError,
    check_raw,
    encoders,
    json_document,
    type_name,
)
from trace_cli.formats.tau2 import ORIGINAL, keep_messages
from trace_cli.formats.tau2_sims import excluded_because, read_simulation, reference_actions
from trace_cli.progress import track
from trace_cli.store.metrics import is_success
from trace_cli.store.rollouts import tool_call_tuples


def _mapping(v: Any, path: Path, key: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{path}: {key}: expected an object, got {type_name(v)}")
    return v


# Run-level fields kept in an episode's `info`: costs, usage, timing (τ²-bench's SimulationRun).
_RUN_INFO = (
    "agent_cost",
    "user_cost",
    "agent_usage",
    "start_time",
    "end_time",
    "duration",
    "timestamp",
    "mode",
)


def _tool_list(defs: Any) -> Any:
    """τ²-bench's `tool_defs` ({name: ToolSignature{name, doc, params}}) as OpenAI tools; other shapes as they are."""
    if not isinstance(defs, dict) or not all(isinstance(v, dict) for v in defs.values()):
        return defs
    out = []
    for name, sig in defs.items():
        fn: dict[str, Any] = {"name": sig.get("name") or name, "description": sig.get("doc") or ""}
        if isinstance(sig.get("params"), dict):
            fn["parameters"] = sig["params"]
        out.append({"type": "function", "function": fn})
    return out


def _tasks(raw: Any, path: Path, fast: bool = False) -> dict[str, Any]:
    """Task id -> task; the parts ingest reads (evaluation_criteria.actions) are type-checked."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InputError(f"{path}: tasks: expected an array, got {type_name(raw)}")
    tasks: dict[str, Any] = {}
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or "id" not in t:
            continue
        if fast and type(t["id"]) is float:
            raise Inexact
        where = f"{path}: tasks[{i}] (id {t['id']})"
        ec = _mapping(t.get("evaluation_criteria"), path, f"tasks[{i}] (id {t['id']}).evaluation_criteria")
        acts = ec.get("actions")
        if acts is not None and (not isinstance(acts, list) or not all(isinstance(a, dict) for a in acts)):
            raise InputError(f"{where}.evaluation_criteria.actions: expected an array of objects")
        tasks[str(t["id"])] = t
    return tasks


def run_dir(path: Path) -> Path | None:
    """The run directory when `path` is τ²-bench's per-run directory format (results.json + simulations/),
    given as the directory or as its results.json; None for the single-file format."""
    if path.is_dir():
        return path
    if path.name == "results.json" and (path.parent / "simulations").is_dir():
        return path.parent
    return None


def _load_dir(run: Path, source: str) -> Parsed:
    """τ²-bench's directory format (Results.save(format="dir")): results.json holds info and tasks (and a
    simulation_index), simulations/<id>.json one run each, read in sorted order as τ²-bench's loader does."""
    meta_path = run / "results.json"
    sims_dir = run / "simulations"
    if not meta_path.is_file():
        raise InputError(f"{run}: not a τ²-bench run directory (no results.json)")
    if not sims_dir.is_dir():
        raise InputError(f"{run}: results.json has no simulations/ directory beside it")
    meta = json_document(meta_path.read_bytes(), meta_path, "a τ²-bench results.json")
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object, got {type_name(meta)}")
    files = sorted(sims_dir.glob("*.json"))
    sims = [json_document(f.read_bytes(), f, "a τ²-bench simulation") for f in files]
    index = meta.get("simulation_index")
    if isinstance(index, list):
        want = {e.get("id") for e in index if isinstance(e, dict)}
        have = {s.get("id") for s in sims if isinstance(s, dict)}
        if want - have:
            missing = sorted(str(x) for x in want - have)[:5]
            raise InputError(f"{run}: simulation_index lists runs with no file in simulations/: {missing}")
        if have - want:
            extra = sorted(str(x) for x in have - want)[:5]
            raise InputError(f"{run}: simulations/ holds runs missing from simulation_index: {extra}")
    doc = {**meta, "simulations": sims}
    return records(doc, run, source, fast=False)


def parse(path: Path, source: str) -> Parsed:
    """Good records as (episode row with its JSON columns encoded, tool-call rows as tuples), and the bad ones."""
    run = run_dir(path)
    if run is not None:
        return _load_dir(run, source)
    data = path.read_bytes()
    if not data or data.isspace():  # (not data.strip(): that copies the file)
        raise InputError(f"{path}: the file is empty; expected a τ²-bench results JSON")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = NOT_PARSED
    if doc is not NOT_PARSED:
        del data  # not needed to build the records (the rare redo below reads the file again)
        try:
            return records(doc, path, source, fast=True)
        except (Inexact, InputError):
            pass  # redone with `json` below: exact values, and every error exactly as `json` reports it
        del doc
        data = path.read_bytes()
    doc = json_document(
        data,
        path,
        "a τ²-bench results JSON",
        hint="a τ²-bench results file is one JSON object with `info`, `tasks` and `simulations`",
    )
    del data
    return records(doc, path, source, fast=False)


def _run_info(s: dict, r, msgs: list[dict], task: dict | None, agent_llm: Any, doc_id: str, idx: int) -> dict:
    """An episode's `info`: the run's own fields, its reward breakdown, and what the original file held (to
    export it back as it was)."""
    extra = {
        **{k: s[k] for k in _RUN_INFO if s.get(k) is not None},
        "agent_llm": agent_llm,
        "reward_breakdown": {
            k: v for k, v in r.reward_info.items() if k in ("db_check", "reward_basis", "reward_breakdown")
        },
        "communicate_info": ((task or {}).get("evaluation_criteria") or {}).get("communicate_info"),
    }
    if r.derived_task:
        extra["task_id_derived"] = True
    original: dict[str, Any] = {
        "doc": doc_id,
        "index": idx,
        "sim": {k: (None if k == "messages" else v) for k, v in s.items()},
    }
    if "messages" in s:
        original["messages"] = (
            keep_messages(msgs, r.raw_messages) if r.raw_messages else {"full": r.raw_messages}
        )
    extra[ORIGINAL] = original
    return extra


def records(doc: Any, path: Path, source: str, *, fast: bool) -> Parsed:
    """A results document -> (good records, bad ones). `fast`: `doc` was parsed by orjson, so raise `Inexact`
    wherever orjson may have changed a value that is stored or reported (see `formats.codec`)."""
    if not isinstance(doc, dict) or "simulations" not in doc:
        got = sorted(doc)[:6] if isinstance(doc, dict) else type_name(doc)
        raise InputError(
            f"{path}: not a τ²-bench results file: expected an object with `simulations` (got {got})"
        )
    sims = doc["simulations"]
    if not isinstance(sims, list):
        raise InputError(f"{path}: `simulations` must be an array, got {type_name(sims)}")
    if not sims:
        raise InputError(f"{path}: `simulations` is empty; nothing to ingest")
    info = _mapping(doc.get("info"), path, "info")
    env_info = _mapping(info.get("environment_info"), path, "info.environment_info")
    domain = env_info.get("domain_name")
    if domain is not None and not isinstance(domain, str):
        raise InputError(
            f"{path}: info.environment_info.domain_name: expected a string, got {type_name(domain)}"
        )
    tools = _tool_list(env_info.get("tool_defs"))
    agent_llm = _mapping(info.get("agent_info"), path, "info.agent_info").get("llm")
    tasks = _tasks(doc.get("tasks"), path, fast)
    # the tool-call rows encode parts of the messages, which `enc` has checked already: no checks needed
    enc, dumps = encoders(fast)
    tools_json = enc(tools)  # one tool list for the whole file
    refs_json: dict[str, Any] = {}  # task id -> its encoded reference actions (shared by the task's trials)
    good: list[tuple[dict, list[tuple]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    trials_seen: set[tuple[str, int]] = set()
    env_policy = env_info.get("policy") if isinstance(env_info.get("policy"), str) else None
    doc_id = hashlib.sha256(
        f"{source}\0{len(sims)}\0{[x.get('id') for x in sims[:3] if isinstance(x, dict)]}".encode()
    ).hexdigest()[:16]
    excluded: list[list[Any]] = []  # [index, run] of the runs τ²-bench leaves out of its metrics
    by_index = {
        e["id"]: e
        for e in doc.get("simulation_index") or []
        if isinstance(e, dict) and isinstance(e.get("id"), str)
    }
    for idx, s in enumerate(track(sims, total=len(sims), description="ingest tau2")):
        sid = s.get("id") if isinstance(s, dict) else None
        if fast and isinstance(s, dict):
            if float in (type(sid), type(s.get("task_id")), type(s.get("trial")), type(s.get("seed"))):
                raise Inexact  # perhaps an integer beyond 64 bits: ids and messages must show it exactly
        where = f"simulations[{idx}]" + (f" (id {sid})" if sid else "")
        if not isinstance(s, dict):
            if fast:
                check_raw(s)
            bad.append(RecordError(where, [f"expected an object, got {type_name(s)}"], s))
            continue
        problems, r = read_simulation(s, where, seen, tasks, by_index)
        task_id, derived_task, trial, seed = r.task_id, r.derived_task, r.trial, r.seed
        reward, term, msgs = r.reward, r.termination, r.messages
        if problems:
            if fast:
                check_raw(s)
            bad.append(RecordError(where, problems, s))
            continue
        # τ²-bench leaves these runs out of its metrics (agent_metrics.get_metrics_df drops infrastructure
        # errors; a run without a reward has nothing to score): excluded, counted, listed, never fatal.
        reason = excluded_because(term, reward)
        if reason is not None:
            if fast:
                check_raw(s)
            bad.append(RecordError(where, [reason], s, excluded=True))
            excluded.append([idx, s])
            continue
        if trial is None:  # τ²-bench allows it (grouping is by task only): number the task's runs in order
            trial = next(t for t in range(len(sims) + 1) if (str(task_id), t) not in trials_seen)
        trials_seen.add((str(task_id), trial))
        policy = s.get("policy") if isinstance(s.get("policy"), str) else env_policy
        if policy and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": policy}, *msgs]
        task = tasks.get(str(task_id))
        if str(task_id) not in refs_json:
            refs_json[str(task_id)] = enc(reference_actions(task))
        ref_json = refs_json[str(task_id)]
        extra = _run_info(s, r, msgs, task, agent_llm, doc_id, idx)
        ep = {
            "episode_id": sid,
            "source": source,
            "env": "tau2",
            "domain": domain,
            "task_id": str(task_id),
            "task_family": None,
            "trial": trial,
            "seed": seed,
            "reward": reward,
            "success": is_success(reward),
            "termination_reason": term,
            "n_turns": sum(1 for m in msgs if m["role"] == "assistant"),
            "messages": enc(msgs),
            "tools": tools_json,
            "reference_actions": ref_json,
            "info": extra,  # encoded below, once the file's first run carries the document
        }
        rows = tool_call_tuples(sid, msgs, dumps=dumps)
        ep["n_tool_calls"] = len(rows)
        ep["task_id_derived"] = (
            derived_task  # not a column (tables take the schema's fields): for the summary
        )
        seen[sid] = idx
        good.append((ep, rows))
    if good:
        fields = {k: (None if k == "simulations" else v) for k, v in doc.items()}
        good[0][0]["info"][ORIGINAL]["document"] = {"fields": fields, "excluded": excluded}
    for ep, _ in good:
        ep["info"] = enc(ep["info"])
    return good, bad
