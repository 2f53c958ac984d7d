"""Stage `ingest`: τ²-bench results JSON or JSONL episodes -> a `rollouts` artifact (episodes + tool_calls).

Bad input is found before anything is written: every problem names the record and the field. With
`on_error: fail` (default) any problem aborts (exit 2, nothing written); with `skip` the good records are
written and the bad ones go to rejects.jsonl with their reasons.

Speed (issue 2): files are parsed with orjson, the cyclic garbage collector is off while the records are built
(it otherwise spends most of the parse time walking millions of young, acyclic containers), the JSON columns
are encoded straight to UTF-8 bytes for Arrow, and JSONL records that a hand-written check can prove valid skip
jsonschema. orjson differs from `json` in a few ways, all handled so that what is stored and every error
message stay exactly as with `json` (see "JSON" below).
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.errors import InputError
from trace_cli.progress import track
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store, file_input, layout
from trace_cli.store.metrics import REWARD_MAX, REWARD_MIN, is_success, reward_problem
from trace_cli.store.metrics import summarize as pass_summary
from trace_cli.store.rollouts import rows_table, string_array, tool_call_tuples, write_tables
from trace_cli.store.tables import EPISODES_SCHEMA, TASK_RESULTS, TOOL_CALLS_SCHEMA

NAME = "ingest"
PATH_KEYS = ("path",)
OUTPUTS = {"rollouts": "rollouts"}


class RecordError(Exception):
    """One bad record: where it is and every problem with it."""

    def __init__(self, where: str, problems: list[str], raw: Any = None, excluded: bool = False):
        super().__init__(f"{where}: " + "; ".join(problems))
        self.where = where
        self.problems = problems
        self.raw = raw
        # a valid run that τ²-bench itself leaves out of its metrics (infrastructure error, no reward):
        # never fails the file, always listed in rejects.jsonl
        self.excluded = excluded


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    path = Path(cfg["path"])
    if cfg["format"] == "jsonl" and path.is_dir():
        raise InputError(f"{path}: is a directory; expected a JSONL file")
    run_dir = _tau2_dir(path) if cfg["format"] == "tau2" else None
    inp = file_input("source_file", run_dir or path)  # a run directory enters the id by all its files
    if "source" not in cfg:
        cfg["source"] = path.name
    id_config = {k: v for k, v in cfg.items() if k != "path"}  # the file enters the id by content
    return Prepared(NAME, cfg, id_config, [inp], dict(OUTPUTS)).finalize()


# ----------------------------------------------------------------------------- τ²-bench


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _tau2_messages(raw: list[Any], where: str) -> tuple[list[dict[str, Any]], list[str]]:
    problems: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            problems.append(f"messages[{i}]: expected an object, got {_type_name(m)}")
            continue
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            problems.append(f"messages[{i}].role: {role!r} is not one of system/user/assistant/tool")
            continue
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            problems.append(f"messages[{i}].content: expected a string or null, got {_type_name(content)}")
        msg: dict[str, Any] = {"role": role, "content": content}
        reasoning = _reasoning(m)
        if reasoning:
            msg["reasoning"] = reasoning
        if role == "tool":
            msg["tool_call_id"] = m.get("id")
            msg["error"] = bool(m.get("error"))
            if m.get("requestor"):
                msg["requestor"] = m["requestor"]
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                problems.append(f"messages[{i}].tool_calls: expected an array, got {_type_name(calls)}")
            else:
                norm = []
                for k, tc in enumerate(calls):
                    if not isinstance(tc, dict) or not isinstance(tc.get("name"), str):
                        problems.append(f"messages[{i}].tool_calls[{k}].name: missing or not a string")
                        continue
                    args = tc.get("arguments", {})
                    if not isinstance(args, dict):
                        problems.append(
                            f"messages[{i}].tool_calls[{k}].arguments: expected an object, got {_type_name(args)}"
                        )
                    entry = {
                        "id": tc.get("id"),
                        "type": "function",
                        "function": {"name": tc["name"], "arguments": args},
                    }
                    if tc.get("requestor"):
                        entry["requestor"] = tc["requestor"]
                    norm.append(entry)
                if norm:
                    msg["tool_calls"] = norm
        if role == "user" and m.get("tool_calls"):
            msg["requestor"] = "user"
        out.append(msg)
    return out, problems


def _reasoning(m: dict[str, Any]) -> str | None:
    """The reasoning text of a τ²-bench message: its own field, or the provider response kept in raw_data
    (τ²-bench stores litellm's response there: choices[0].message.reasoning_content)."""
    for key in ("reasoning", "reasoning_content"):
        if isinstance(m.get(key), str) and m[key]:
            return m[key]
    raw = m.get("raw_data")
    if isinstance(raw, dict):
        choices = raw.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message")
            if isinstance(msg, dict):
                for key in ("reasoning_content", "reasoning"):
                    if isinstance(msg.get(key), str) and msg[key]:
                        return msg[key]
    return None


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected JSON") from e


# ----------------------------------------------------------------------------- JSON
# orjson is several times faster than `json` but not a drop-in: it rejects what `json` accepts beyond RFC 8259
# (NaN/Infinity, lone surrogates, nesting deeper than 1024, numbers that overflow a double) and, silently, turns
# an integer outside [-2**63, 2**64) into a float. So a document (τ²) or line (JSONL) orjson rejects is parsed
# with `json` instead, and one parsed with orjson is redone with `json` (`_Inexact`) when anything it stores or
# reports could show such a rounded integer: a float >= 1e18 in its encoded output, a float where an integer id
# belongs, a bad record. Records done with `json` are also encoded with `json` (orjson writes NaN as null).
# Otherwise both parsers give the same values, so the stored data and the messages do not depend on the parser;
# only the stored JSON text is compact (`{"a":1}` rather than `{"a": 1}`).


class _Inexact(Exception):
    """orjson may have changed a value (an integer beyond 64 bits, NaN): redo this record with `json`."""


_NOT_PARSED = object()
# a float >= 1e18 as orjson writes it (1.2345678901234568e+22): the only trace a rounded integer leaves
_BIG_FLOAT = re.compile(rb"[0-9]e\+(?:1[89]|[2-9][0-9]|[0-9]{3})")


def _fast_dumps(v: Any) -> bytes:
    """orjson-encode a value parsed by orjson (UTF-8 bytes, which Arrow takes as a string as they are)."""
    try:
        out = orjson.dumps(v)
    except TypeError as e:  # an int beyond 64 bits, a lone surrogate, nesting deeper than 254: `json` does it
        raise _Inexact from e
    if b"e+" in out and _BIG_FLOAT.search(out):
        raise _Inexact
    return bytes(memoryview(out))  # see _dumps_trimmed


def _dumps_trimmed(v: Any) -> bytes:
    """orjson.dumps, copied to a buffer of its size: orjson's own is rounded up to a power of two, at least
    4 KiB, which for a million small tool-call arguments held until the table is built is gigabytes."""
    return bytes(memoryview(orjson.dumps(v)))


def _std_dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def _fast_enc(v: Any) -> bytes | None:
    return None if v is None else _fast_dumps(v)


def _std_enc(v: Any) -> str | None:
    return None if v is None else json.dumps(v, ensure_ascii=False)


def _check_raw(raw: Any) -> None:
    """A bad record parsed by orjson: its messages and reject line must not show a rounded integer."""
    _fast_dumps(raw)


def _mapping(v: Any, path: Path, key: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{path}: {key}: expected an object, got {_type_name(v)}")
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


def _task_id_for(s: dict[str, Any], tasks: dict[str, Any], by_index: dict[str, Any]) -> tuple[Any, bool]:
    """A task id for a run that has none: the run's embedded task, the file's simulation_index, the file's
    only task; else a stable id derived from the first user message (runs of one task share it), marked in
    `info.task_id_derived` and counted in the summary."""
    import hashlib

    task = s.get("task")
    if isinstance(task, dict) and isinstance(task.get("id"), str | int):
        return task["id"], False
    entry = by_index.get(s.get("id"))
    if entry is not None and isinstance(entry.get("task_id"), str | int):
        return entry["task_id"], False
    if len(tasks) == 1:
        return next(iter(tasks)), False
    first = next(
        (
            m.get("content")
            for m in s.get("messages") or []
            if isinstance(m, dict) and m.get("role") == "user"
        ),
        None,
    )
    basis = first if isinstance(first, str) and first else str(s.get("id"))
    return "derived-" + hashlib.sha256(basis.encode("utf-8")).hexdigest()[:12], True


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


def _tau2_tasks(raw: Any, path: Path, fast: bool = False) -> dict[str, Any]:
    """Task id -> task; the parts ingest reads (evaluation_criteria.actions) are type-checked."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InputError(f"{path}: tasks: expected an array, got {_type_name(raw)}")
    tasks: dict[str, Any] = {}
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or "id" not in t:
            continue
        if fast and type(t["id"]) is float:
            raise _Inexact
        where = f"{path}: tasks[{i}] (id {t['id']})"
        ec = _mapping(t.get("evaluation_criteria"), path, f"tasks[{i}] (id {t['id']}).evaluation_criteria")
        acts = ec.get("actions")
        if acts is not None and (not isinstance(acts, list) or not all(isinstance(a, dict) for a in acts)):
            raise InputError(f"{where}.evaluation_criteria.actions: expected an array of objects")
        tasks[str(t["id"])] = t
    return tasks


def _tau2_dir(path: Path) -> Path | None:
    """The run directory when `path` is τ²-bench's per-run directory format (results.json + simulations/),
    given as the directory or as its results.json; None for the single-file format."""
    if path.is_dir():
        return path
    if path.name == "results.json" and (path.parent / "simulations").is_dir():
        return path.parent
    return None


def _load_tau2_dir(run: Path, source: str) -> tuple[list[tuple[dict, list[tuple]]], list[RecordError]]:
    """τ²-bench's directory format (Results.save(format="dir")): results.json holds info and tasks (and a
    simulation_index), simulations/<id>.json one run each, read in sorted order as τ²-bench's loader does."""
    meta_path = run / "results.json"
    sims_dir = run / "simulations"
    if not meta_path.is_file():
        raise InputError(f"{run}: not a τ²-bench run directory (no results.json)")
    if not sims_dir.is_dir():
        raise InputError(f"{run}: results.json has no simulations/ directory beside it")
    meta = _json_document(meta_path.read_bytes(), meta_path, "a τ²-bench results.json")
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object, got {_type_name(meta)}")
    files = sorted(sims_dir.glob("*.json"))
    sims = [_json_document(f.read_bytes(), f, "a τ²-bench simulation") for f in files]
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
    return _tau2_records(doc, run, source, fast=False)


def _json_document(data: bytes, path: Path, what: str, hint: str | None = None) -> Any:
    """One JSON document parsed with `json` (exact values and its error positions), or an InputError."""
    text = _decode(data, path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty; expected {what}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); is the file truncated?", hint=hint
        ) from e
    except RecursionError as e:
        raise InputError(f"{path}: {_TOO_DEEP}", hint=_TOO_DEEP_FIX) from e


_TOO_DEEP = "JSON nested too deeply to read (deeper than ~900 levels of arrays/objects)"
_TOO_DEEP_FIX = "no τ²-bench or JSONL episode nests that deep: flatten the value or drop the record"


def _parse_tau2(path: Path, source: str) -> tuple[list[tuple[dict, list[tuple]]], list[RecordError]]:
    """Good records as (episode row with its JSON columns encoded, tool-call rows as tuples), and the bad ones."""
    run = _tau2_dir(path)
    if run is not None:
        return _load_tau2_dir(run, source)
    data = path.read_bytes()
    if not data or data.isspace():  # (not data.strip(): that copies the file)
        raise InputError(f"{path}: the file is empty; expected a τ²-bench results JSON")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = _NOT_PARSED
    if doc is not _NOT_PARSED:
        del data  # not needed to build the records (the rare redo below reads the file again)
        try:
            return _tau2_records(doc, path, source, fast=True)
        except (_Inexact, InputError):
            pass  # redone with `json` below: exact values, and every error exactly as `json` reports it
        del doc
        data = path.read_bytes()
    doc = _json_document(
        data,
        path,
        "a τ²-bench results JSON",
        hint="a τ²-bench results file is one JSON object with `info`, `tasks` and `simulations`",
    )
    del data
    return _tau2_records(doc, path, source, fast=False)


def _tau2_records(
    doc: Any, path: Path, source: str, *, fast: bool
) -> tuple[list[tuple[dict, list[tuple]]], list[RecordError]]:
    if not isinstance(doc, dict) or "simulations" not in doc:
        got = sorted(doc)[:6] if isinstance(doc, dict) else _type_name(doc)
        raise InputError(
            f"{path}: not a τ²-bench results file: expected an object with `simulations` (got {got})"
        )
    sims = doc["simulations"]
    if not isinstance(sims, list):
        raise InputError(f"{path}: `simulations` must be an array, got {_type_name(sims)}")
    if not sims:
        raise InputError(f"{path}: `simulations` is empty; nothing to ingest")
    info = _mapping(doc.get("info"), path, "info")
    env_info = _mapping(info.get("environment_info"), path, "info.environment_info")
    domain = env_info.get("domain_name")
    if domain is not None and not isinstance(domain, str):
        raise InputError(
            f"{path}: info.environment_info.domain_name: expected a string, got {_type_name(domain)}"
        )
    tools = _tool_list(env_info.get("tool_defs"))
    agent_llm = _mapping(info.get("agent_info"), path, "info.agent_info").get("llm")
    tasks = _tau2_tasks(doc.get("tasks"), path, fast)
    # the tool-call rows encode parts of the messages, which `enc` has checked already: no checks needed
    enc, dumps = (_fast_enc, _dumps_trimmed) if fast else (_std_enc, _std_dumps)
    tools_json = enc(tools)  # one tool list for the whole file
    refs_json: dict[str, Any] = {}  # task id -> its encoded reference actions (shared by the task's trials)
    good: list[tuple[dict, list[tuple]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    trials_seen: set[tuple[str, int]] = set()
    env_policy = env_info.get("policy") if isinstance(env_info.get("policy"), str) else None
    by_index = {
        e["id"]: e
        for e in doc.get("simulation_index") or []
        if isinstance(e, dict) and isinstance(e.get("id"), str)
    }
    for idx, s in enumerate(track(sims, total=len(sims), description="ingest tau2")):
        sid = s.get("id") if isinstance(s, dict) else None
        if fast and isinstance(s, dict):
            if float in (type(sid), type(s.get("task_id")), type(s.get("trial")), type(s.get("seed"))):
                raise _Inexact  # perhaps an integer beyond 64 bits: ids and messages must show it exactly
        where = f"simulations[{idx}]" + (f" (id {sid})" if sid else "")
        if not isinstance(s, dict):
            if fast:
                _check_raw(s)
            bad.append(RecordError(where, [f"expected an object, got {_type_name(s)}"], s))
            continue
        problems: list[str] = []
        if not isinstance(sid, str) or not sid:
            problems.append("id: missing or not a string")
        elif sid in seen:
            problems.append(f"id: duplicate of simulations[{seen[sid]}]")
        task_id = s.get("task_id")
        derived_task = False
        if task_id is None:
            task_id, derived_task = _task_id_for(s, tasks, by_index)
        if not isinstance(task_id, str | int) or isinstance(task_id, bool):
            problems.append(f"task_id: not a string (got {_type_name(task_id)})")
        trial = s.get("trial")
        if trial is not None and (not isinstance(trial, int) or isinstance(trial, bool)):
            problems.append(f"trial: expected an integer or null, got {_type_name(trial)}")
        seed = s.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            problems.append(f"seed: expected an integer or null, got {_type_name(seed)}")
        ri = s.get("reward_info")
        reward = None
        if ri is not None and not isinstance(ri, dict):
            problems.append(f"reward_info: expected an object, got {_type_name(ri)}")
        elif isinstance(ri, dict) and ri.get("reward") is not None:
            if not isinstance(ri["reward"], int | float) or isinstance(ri["reward"], bool):
                problems.append(f"reward_info.reward: expected a number, got {_type_name(ri['reward'])}")
            else:
                reward = float(ri["reward"])
                if bad_reward := reward_problem(reward):
                    problems.append(f"reward_info.reward: {bad_reward}")
        term = s.get("termination_reason")
        if term is not None and not isinstance(term, str):
            problems.append(f"termination_reason: expected a string, got {_type_name(term)}")
        raw_msgs = s.get("messages")
        msgs: list[dict] = []
        if raw_msgs is not None and not isinstance(raw_msgs, list):
            problems.append(f"messages: expected an array, got {_type_name(raw_msgs)}")
        elif raw_msgs:
            msgs, mp = _tau2_messages(raw_msgs, where)
            problems += mp
        if problems:
            if fast:
                _check_raw(s)
            bad.append(RecordError(where, problems, s))
            continue
        # τ²-bench leaves these runs out of its metrics (agent_metrics.get_metrics_df drops infrastructure
        # errors; a run without a reward has nothing to score): excluded, counted, listed, never fatal.
        reason = None
        if term == "infrastructure_error":
            reason = (
                "termination_reason is infrastructure_error (τ²-bench excludes these runs from its metrics)"
            )
        elif reward is None:
            reason = "no reward_info.reward (the run was not evaluated; τ²-bench cannot score it)"
        if reason is not None:
            if fast:
                _check_raw(s)
            bad.append(RecordError(where, [reason], s, excluded=True))
            continue
        if trial is None:  # τ²-bench allows it (grouping is by task only): number the task's runs in order
            trial = next(t for t in range(len(sims) + 1) if (str(task_id), t) not in trials_seen)
        trials_seen.add((str(task_id), trial))
        policy = s.get("policy") if isinstance(s.get("policy"), str) else env_policy
        if policy and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": policy}, *msgs]
        task = tasks.get(str(task_id))
        if str(task_id) in refs_json:
            ref_json = refs_json[str(task_id)]
        else:
            ref_actions = None
            if task is not None:
                acts = (task.get("evaluation_criteria") or {}).get("actions") or None
                if acts:
                    ref_actions = [
                        {
                            "name": a.get("name"),
                            "arguments": a.get("arguments", {}),
                            "requestor": a.get("requestor"),
                        }
                        for a in acts
                    ]
            ref_json = refs_json[str(task_id)] = enc(ref_actions)
        extra = {
            **{k: s[k] for k in _RUN_INFO if s.get(k) is not None},
            "agent_llm": agent_llm,
            "reward_breakdown": {
                k: v for k, v in ri.items() if k in ("db_check", "reward_basis", "reward_breakdown")
            },
            "communicate_info": ((task or {}).get("evaluation_criteria") or {}).get("communicate_info"),
        }
        if derived_task:
            extra["task_id_derived"] = True
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
            "info": enc(extra),
        }
        rows = tool_call_tuples(sid, msgs, dumps=dumps)
        ep["n_tool_calls"] = len(rows)
        ep["task_id_derived"] = (
            derived_task  # not a column (tables take the schema's fields): for the summary
        )
        seen[sid] = idx
        good.append((ep, rows))
    return good, bad


# ----------------------------------------------------------------------------- JSONL


def _fast_args(s: str) -> Any:
    """orjson for a string of call arguments; `_Inexact` when only `json` reads it (NaN, ...)."""
    try:
        return orjson.loads(s)
    except orjson.JSONDecodeError:
        json.loads(s)  # raises JSONDecodeError when `json` rejects it too: then it is kept raw
        raise _Inexact from None


def _jsonl_messages(raw: list[dict[str, Any]], fast: bool = False) -> list[dict[str, Any]]:
    loads = _fast_args if fast else json.loads
    out = []
    for m in raw:
        msg = dict(m)
        if msg.get("role") == "developer":  # OpenAI's name for the system prompt of newer models
            msg["role"] = "system"
        if msg.get("tool_calls"):
            norm = []
            for tc in msg["tool_calls"]:
                fn = dict(tc["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except json.JSONDecodeError:
                        pass  # kept raw: a malformed call is real agent behaviour worth keeping
                norm.append({"id": tc.get("id"), "type": "function", "function": fn})
            msg["tool_calls"] = norm
        if msg.get("role") == "tool":
            msg["error"] = bool(msg.get("error"))
        out.append(msg)
    return out


def _parse_jsonl(path: Path, source: str) -> tuple[list[tuple[dict, list[tuple]]], list[RecordError]]:
    """Good records as (episode row with its JSON columns encoded, tool-call rows as tuples), and the bad ones.

    Lines end at "\n" only (and a "\r" before it): U+2028, U+2029 and U+0085 may appear raw inside JSON strings.
    """
    data = path.read_bytes()
    good: list[tuple[dict, list[tuple]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    lines = track(_lines(data), total=data.count(b"\n") + 1, description="ingest jsonl")
    for lineno, line in enumerate(lines, start=1):
        if not line:
            continue
        try:
            out = _jsonl_line(line, lineno, source, seen, data, path)
        except RecursionError:
            out = RecordError(f"line {lineno}", [_TOO_DEEP], str(line[:200], "utf-8", "replace") + "…")
        if out is None:
            continue
        if isinstance(out, RecordError):
            bad.append(out)
        else:
            good.append(out)
    if not good and not bad:  # every line blank (white space, including Unicode's)
        raise InputError(f"{path}: the file is empty; expected one JSON episode per line")
    if not good and bad[0].problems[0].startswith("not valid JSON") and data.lstrip()[:1] in (b"{", b"["):
        _not_jsonl(data, path)
    return good, bad


def _not_jsonl(data: bytes, path: Path) -> None:
    """No line is a good record and the file starts like a JSON document: if it is one (pretty-printed, or a
    τ²-bench results file), say so instead of listing thousands of bad lines."""
    try:
        doc = orjson.loads(data)
    except (orjson.JSONDecodeError, RecursionError):
        return
    if isinstance(doc, dict) and "simulations" in doc:
        raise InputError(
            f"{path}: this looks like a τ²-bench results file (a JSON object with `simulations`), "
            "not JSON Lines",
            hint=f"use `trace ingest tau2 {path}`",
        )
    if isinstance(doc, list):
        raise InputError(
            f"{path}: one JSON array spread over several lines, not JSON Lines (one episode object per line)",
            hint="write one episode per line, e.g. `jq -c '.[]' FILE > episodes.jsonl`",
        )
    raise InputError(
        f"{path}: one JSON document spread over several lines, not JSON Lines (one episode object per line)",
        hint="write each episode as one compact line, e.g. `jq -c . FILE > episodes.jsonl`",
    )


def _jsonl_line(line: memoryview, lineno: int, source: str, seen: dict[str, int], data: bytes, path: Path):
    """One line: None when blank, else the good record or its RecordError."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        rec = _NOT_PARSED
    if rec is not _NOT_PARSED:
        try:
            return _jsonl_record(rec, lineno, source, seen, fast=True)
        except _Inexact:
            pass
    # what orjson rejects or may have changed: `json`, exactly as before (values and messages)
    try:
        text = str(line, "utf-8")
    except UnicodeDecodeError:
        _decode(data, path)  # raises, naming the file's first bad byte (the earlier lines were good)
        raise
    if not text.strip():
        return None  # only Unicode white space
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        return RecordError(
            f"line {lineno}", [f"not valid JSON ({e.msg} at column {e.colno}); truncated line?"], text
        )
    return _jsonl_record(rec, lineno, source, seen, fast=False)


def _lines(data: bytes) -> Iterator[memoryview]:
    """The lines of `data` as views (no copies), split at b"\\n" only, without a "\\r" before it."""
    view = memoryview(data)
    start = 0
    while True:
        end = data.find(b"\n", start)
        stop = len(data) if end < 0 else end
        yield view[start : stop - 1 if stop > start and data[stop - 1] == 13 else stop]
        if end < 0:
            return
        start = end + 1


def _jsonl_record(
    rec: Any, lineno: int, source: str, seen: dict[str, int], *, fast: bool
) -> tuple[dict, list[tuple]] | RecordError:
    """One parsed line -> (episode row, tool-call rows), or its RecordError. `seen` is updated only on success."""
    from trace_cli.config.schemas import validate
    from trace_cli.errors import ValidationError

    where = f"line {lineno}"
    if isinstance(rec, dict) and isinstance(rec.get("episode_id"), str):
        where += f" (episode_id {rec['episode_id']})"
    if not _fast_valid(rec):
        try:
            validate(rec, "episode.v1.json")
        except ValidationError as ve:
            if fast:
                _check_raw(rec)
            return RecordError(where, ve.errors, rec)
    task_id, trial, seed = rec["task_id"], rec.get("trial", 0), rec.get("seed")
    if fast and float in (type(task_id), type(trial), type(seed)):
        raise _Inexact  # an integer beyond 64 bits, or a float the schema accepts as an integer (1.0)
    task_id = str(task_id)
    eid = rec.get("episode_id") or f"{source}:{task_id}:{trial}:{lineno}"
    if eid in seen:
        if fast:
            _check_raw(rec)
        return RecordError(where, [f"episode_id: duplicate {eid!r} (first on line {seen[eid]})"], rec)
    reward = float(rec["reward"])
    if bad_reward := reward_problem(reward):
        if fast:
            _check_raw(rec)
        return RecordError(where, [f"reward: {bad_reward}"], rec)
    msgs = _jsonl_messages(rec["messages"], fast)
    enc, dumps = (_fast_enc, _dumps_trimmed) if fast else (_std_enc, _std_dumps)  # (see _tau2_records)
    info = rec.get("info")
    ep = {
        "episode_id": eid,
        "source": source,
        "env": info.get("env", "jsonl") if isinstance(info, dict) else "jsonl",
        "domain": rec.get("domain"),
        "task_id": task_id,
        "task_family": (info or {}).get("task_family"),
        "trial": trial,
        "seed": seed,
        "reward": reward,
        "success": bool(rec["success"]) if "success" in rec else is_success(reward),
        "termination_reason": rec.get("termination_reason"),
        "n_turns": sum(1 for m in msgs if m["role"] == "assistant"),
        "messages": enc(msgs),
        "tools": enc(rec.get("tools")),
        "reference_actions": enc(rec.get("reference_actions")),
        "info": enc(info),
    }
    rows = tool_call_tuples(eid, msgs, dumps=dumps)
    ep["n_tool_calls"] = len(rows)
    seen[eid] = lineno
    return ep, rows


# ----------------------------------------------------------------------------- run


TASKS_FILE, TASK_RESULTS_SCHEMA = TASK_RESULTS.file, TASK_RESULTS.schema


def _tasks_table(per_task: list[dict[str, Any]]) -> pa.Table:
    rows = [
        {k: t[k] for k in ("task_id", "domain", "trials", "successes", "mean_reward")}
        | {"pass_hat_k": json.dumps(t["pass_hat_k"])}
        for t in per_task
    ]
    return pa.Table.from_pylist(rows, schema=TASK_RESULTS_SCHEMA)


_TEXT_COLUMNS = ("messages", "tools", "reference_actions", "info", "arguments", "result")


def _episodes_table(eps: list[dict[str, Any]]) -> pa.Table:
    cols = {f.name: [e.get(f.name) for e in eps] for f in EPISODES_SCHEMA}
    for k in _TEXT_COLUMNS:
        if k in cols:
            cols[k] = string_array(cols[k])
    return pa.Table.from_pydict(cols, schema=EPISODES_SCHEMA)


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    # Parsing builds millions of small containers, none in a reference cycle: with the cyclic collector on,
    # CPython re-walks the ever-growing heap again and again (most of the CPU time of a big ingest).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(prepared, store, name=name, overrides=overrides, replace=replace)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(prepared: Prepared, store: Store, *, name, overrides, replace) -> dict[str, Artifact]:
    cfg = prepared.config
    path = Path(cfg["path"])
    parse = _parse_tau2 if cfg["format"] == "tau2" else _parse_jsonl
    try:
        good, rejected = parse(path, cfg["source"])
    except RecursionError as e:  # a value nested deeper than the parsers/validator can recurse
        raise InputError(f"{path}: {_TOO_DEEP}", hint=_TOO_DEEP_FIX) from e
    excluded = [b for b in rejected if b.excluded]
    bad = [b for b in rejected if not b.excluded]
    if bad and cfg["on_error"] == "fail":
        shown = "\n".join(f"  {b}" for b in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise InputError(
            f"{path}: {len(bad)} bad record{'s' if len(bad) != 1 else ''}; nothing was written:\n{shown}{more}",
            hint="fix the file, or pass --on-error skip to ingest the good records and get rejects.jsonl",
        )
    if not good:
        why = f"{len(bad)} rejected" + (
            f", {len(excluded)} excluded as τ²-bench excludes them" if excluded else ""
        )
        shown = "\n".join(f"  {b}" for b in (excluded + bad)[:5])
        more = f"\n  ... and {len(rejected) - 5} more" if len(rejected) > 5 else ""
        raise InputError(
            f"{path}: no records to ingest ({why}); nothing was written:\n{shown}{more}",
            hint="an artifact (and its rejects.jsonl) needs at least one good record; every reason is above"
            if len(rejected) <= 5
            else "an artifact (and its rejects.jsonl) needs at least one good record; "
            "run without --on-error skip to see the first 20 reasons",
        )
    with prepared.writer(store, "rollouts", name=name, overrides=overrides, replace=replace) as w:
        calls = [r for _, rows in good for r in rows]
        write_tables(
            w.path,
            _episodes_table([ep for ep, _ in good]),
            rows_table(calls, TOOL_CALLS_SCHEMA, text=_TEXT_COLUMNS),
        )
        if rejected:
            with open(w.path / layout.REJECTS, "w", encoding="utf-8") as f:
                for b in rejected:
                    line = {"where": b.where, "errors": b.problems, "record": b.raw}
                    if b.excluded:
                        line["excluded"] = True
                    f.write(json.dumps(line, default=str) + "\n")
        n_succ = sum(1 for ep, _ in good if ep["success"])
        passk, per_task = pass_summary([ep for ep, _ in good], "domain")
        pq.write_table(_tasks_table(per_task), w.path / TASKS_FILE)
        w.summary.update(
            {
                "episodes": len(good),
                "successes": n_succ,
                "failures": len(good) - n_succ,
                "tool_calls": len(calls),
                "rejected": len(bad),
                "excluded": len(excluded),
                "derived_task_ids": sum(1 for ep, _ in good if ep.get("task_id_derived")),
                "format": cfg["format"],
                "source": cfg["source"],
                "tasks": passk["tasks"],
                "pass@1": passk["pass@1"],
                "pass^k": passk["pass^k"],
                "domains": passk["groups"],
            }
        )
    return {"rollouts": w.artifact}


# ----------------------------------------------------------------------------- fast validation
# A hand-written check of schemas/episode.v1.json for the common case, ~50x cheaper than jsonschema: True only
# when it can prove the record valid; anything else (a type it does not expect, a missing key, 1.0 as an
# integer, ...) goes through jsonschema, which decides and gives the detailed messages. Keep it in step with
# the schema (tests/stages/test_ingest_perf.py checks it against jsonschema on generated records).

_EPISODE_KEYS = frozenset(
    (
        "kind", "episode_id", "task_id", "domain", "trial", "seed", "reward", "success", "termination_reason",
        "reference_actions", "tools", "info", "messages",
    )
)  # fmt: skip
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
_MISSING = object()


def _fast_valid(rec: Any) -> bool:
    if type(rec) is not dict or not rec.keys() <= _EPISODE_KEYS:  # additionalProperties: false
        return False
    get = rec.get
    if type(get("task_id")) not in (str, int) or type(get("reward")) not in (int, float):
        return False
    if not REWARD_MIN <= rec["reward"] <= REWARD_MAX:  # also False for NaN (then reward_problem says why)
        return False
    if "kind" in rec and (type(rec["kind"]) is not str or rec["kind"] != "episode"):
        return False
    if "episode_id" in rec and (type(rec["episode_id"]) is not str or not rec["episode_id"]):
        return False
    for k in ("domain", "termination_reason"):
        if k in rec and type(rec[k]) is not str:
            return False
    if "trial" in rec and (type(rec["trial"]) is not int or rec["trial"] < 0):
        return False
    if "seed" in rec and rec["seed"] is not None and type(rec["seed"]) is not int:
        return False
    if "success" in rec and type(rec["success"]) is not bool:
        return False
    if "info" in rec and type(rec["info"]) is not dict:
        return False
    if "reference_actions" in rec:
        acts = rec["reference_actions"]
        if type(acts) is not list:
            return False
        for a in acts:
            if type(a) is not dict or type(a.get("name")) is not str or type(a.get("arguments")) is not dict:
                return False
    if "tools" in rec:
        tools = rec["tools"]
        if type(tools) is not list:
            return False
        for t in tools:
            if type(t) is not dict or type(t.get("type")) is not str or t["type"] != "function":
                return False
            fn = t.get("function")
            if type(fn) is not dict or type(fn.get("name")) is not str:
                return False
            if "description" in fn and type(fn["description"]) is not str:
                return False
            if "parameters" in fn and type(fn["parameters"]) is not dict:
                return False
    msgs = get("messages")
    if type(msgs) is not list or not msgs:
        return False
    for m in msgs:
        if type(m) is not dict:
            return False
        role = m.get("role")
        if type(role) is not str or role not in _ROLES:
            return False
        content = m.get("content")
        if content is not None and type(content) is not str:
            return False
        for k in ("tool_call_id", "name"):
            if k in m and type(m[k]) is not str:
                return False
        if "error" in m and type(m["error"]) is not bool:
            return False
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if type(calls) is not list:
            return False
        for tc in calls:
            if type(tc) is not dict:
                return False
            if "id" in tc and type(tc["id"]) is not str:
                return False
            if "type" in tc and (type(tc["type"]) is not str or tc["type"] != "function"):
                return False
            fn = tc.get("function")
            if type(fn) is not dict:
                return False
            name = fn.get("name")
            if type(name) is not str or not name:
                return False
            if type(fn.get("arguments", _MISSING)) not in (str, dict):
                return False
    return True
