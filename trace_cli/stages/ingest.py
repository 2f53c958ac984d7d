"""Stage `ingest`: τ²-bench results JSON or JSONL episodes -> a `rollouts` artifact (episodes + tool_calls).

Bad input is found before anything is written: every problem names the record and the field. With
`on_error: fail` (default) any problem aborts (exit 2, nothing written); with `skip` the good records are
written and the bad ones go to rejects.jsonl with their reasons.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_cli.errors import InputError
from trace_cli.progress import track
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store, file_input, layout
from trace_cli.store.rollouts import tool_call_rows, write_tables

NAME = "ingest"
PATH_KEYS = ("path",)
OUTPUTS = {"rollouts": "rollouts"}
SUCCESS_TOL = 1e-6  # τ²-bench: a task succeeds when |reward - 1| <= 1e-6


class RecordError(Exception):
    """One bad record: where it is and every problem with it."""

    def __init__(self, where: str, problems: list[str], raw: Any = None):
        super().__init__(f"{where}: " + "; ".join(problems))
        self.where = where
        self.problems = problems
        self.raw = raw


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    path = Path(cfg["path"])
    inp = file_input("source_file", path)
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
                    entry = {"id": tc.get("id"), "type": "function", "function": {"name": tc["name"], "arguments": args}}
                    if tc.get("requestor"):
                        entry["requestor"] = tc["requestor"]
                    norm.append(entry)
                if norm:
                    msg["tool_calls"] = norm
        if role == "user" and m.get("tool_calls"):
            msg["requestor"] = "user"
        out.append(msg)
    return out, problems


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected JSON") from e


def _mapping(v: Any, path: Path, key: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{path}: {key}: expected an object, got {_type_name(v)}")
    return v


def _tau2_tasks(raw: Any, path: Path) -> dict[str, Any]:
    """Task id -> task; the parts ingest reads (evaluation_criteria.actions) are type-checked."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise InputError(f"{path}: tasks: expected an array, got {_type_name(raw)}")
    tasks: dict[str, Any] = {}
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or "id" not in t:
            continue
        where = f"{path}: tasks[{i}] (id {t['id']})"
        ec = _mapping(t.get("evaluation_criteria"), path, f"tasks[{i}] (id {t['id']}).evaluation_criteria")
        acts = ec.get("actions")
        if acts is not None and (not isinstance(acts, list) or not all(isinstance(a, dict) for a in acts)):
            raise InputError(f"{where}.evaluation_criteria.actions: expected an array of objects")
        tasks[str(t["id"])] = t
    return tasks


def _parse_tau2(path: Path, source: str) -> tuple[list[tuple[dict, list[dict]]], list[RecordError]]:
    text = _read_text(path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty; expected a τ²-bench results JSON")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); is the file truncated?",
            hint="a τ²-bench results file is one JSON object with `info`, `tasks` and `simulations`",
        ) from e
    if not isinstance(doc, dict) or "simulations" not in doc:
        got = sorted(doc)[:6] if isinstance(doc, dict) else _type_name(doc)
        raise InputError(f"{path}: not a τ²-bench results file: expected an object with `simulations` (got {got})")
    sims = doc["simulations"]
    if not isinstance(sims, list):
        raise InputError(f"{path}: `simulations` must be an array, got {_type_name(sims)}")
    if not sims:
        raise InputError(f"{path}: `simulations` is empty; nothing to ingest")
    info = _mapping(doc.get("info"), path, "info")
    env_info = _mapping(info.get("environment_info"), path, "info.environment_info")
    domain = env_info.get("domain_name")
    if domain is not None and not isinstance(domain, str):
        raise InputError(f"{path}: info.environment_info.domain_name: expected a string, got {_type_name(domain)}")
    tools = env_info.get("tool_defs")
    agent_llm = _mapping(info.get("agent_info"), path, "info.agent_info").get("llm")
    tasks = _tau2_tasks(doc.get("tasks"), path)
    good: list[tuple[dict, list[dict]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    for idx, s in enumerate(track(sims, total=len(sims), description="ingest tau2")):
        sid = s.get("id") if isinstance(s, dict) else None
        where = f"simulations[{idx}]" + (f" (id {sid})" if sid else "")
        if not isinstance(s, dict):
            bad.append(RecordError(where, [f"expected an object, got {_type_name(s)}"], s))
            continue
        problems: list[str] = []
        if not isinstance(sid, str) or not sid:
            problems.append("id: missing or not a string")
        elif sid in seen:
            problems.append(f"id: duplicate of simulations[{seen[sid]}]")
        task_id = s.get("task_id")
        if not isinstance(task_id, str | int) or isinstance(task_id, bool):
            problems.append(f"task_id: missing or not a string (got {_type_name(task_id)})")
        trial = s.get("trial", 0)
        if not isinstance(trial, int) or isinstance(trial, bool):
            problems.append(f"trial: expected an integer, got {_type_name(trial)}")
        seed = s.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            problems.append(f"seed: expected an integer or null, got {_type_name(seed)}")
        ri = s.get("reward_info")
        reward = None
        if not isinstance(ri, dict):
            problems.append("reward_info: missing (every simulation needs reward_info.reward)")
        elif "reward" not in ri or ri["reward"] is None:
            problems.append("reward_info.reward: missing")
        elif not isinstance(ri["reward"], int | float) or isinstance(ri["reward"], bool):
            problems.append(f"reward_info.reward: expected a number, got {_type_name(ri['reward'])}")
        else:
            reward = float(ri["reward"])
        term = s.get("termination_reason")
        if term is not None and not isinstance(term, str):
            problems.append(f"termination_reason: expected a string, got {_type_name(term)}")
        raw_msgs = s.get("messages")
        msgs: list[dict] = []
        if not isinstance(raw_msgs, list):
            problems.append(f"messages: expected an array, got {_type_name(raw_msgs)}")
        else:
            msgs, mp = _tau2_messages(raw_msgs, where)
            problems += mp
        if problems:
            bad.append(RecordError(where, problems, s))
            continue
        seen[sid] = idx
        task = tasks.get(str(task_id))
        ref_actions = None
        if task is not None:
            acts = (task.get("evaluation_criteria") or {}).get("actions") or None
            if acts:
                ref_actions = [
                    {"name": a.get("name"), "arguments": a.get("arguments", {}), "requestor": a.get("requestor")}
                    for a in acts
                ]
        extra = {
            "agent_llm": agent_llm,
            "reward_breakdown": {k: v for k, v in ri.items() if k in ("db_check", "reward_basis", "reward_breakdown")},
            "communicate_info": ((task or {}).get("evaluation_criteria") or {}).get("communicate_info"),
        }
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
            "success": abs(reward - 1.0) <= SUCCESS_TOL,
            "termination_reason": term,
            "n_turns": sum(1 for m in msgs if m["role"] == "assistant"),
            "messages": msgs,
            "tools": tools,
            "reference_actions": ref_actions,
            "info": extra,
        }
        good.append((ep, tool_call_rows(sid, msgs)))
    return good, bad


# ----------------------------------------------------------------------------- JSONL


def _jsonl_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in raw:
        msg = dict(m)
        if msg.get("tool_calls"):
            norm = []
            for tc in msg["tool_calls"]:
                fn = dict(tc["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except json.JSONDecodeError:
                        pass  # kept raw: a malformed call is real agent behaviour worth keeping
                norm.append({"id": tc.get("id"), "type": "function", "function": fn})
            msg["tool_calls"] = norm
        if msg.get("role") == "tool":
            msg["error"] = bool(msg.get("error"))
        out.append(msg)
    return out


def _parse_jsonl(path: Path, source: str) -> tuple[list[tuple[dict, list[dict]]], list[RecordError]]:
    from trace_cli.config.schemas import validate
    from trace_cli.errors import ValidationError

    lines = _read_text(path).splitlines()
    if not any(line.strip() for line in lines):
        raise InputError(f"{path}: the file is empty; expected one JSON episode per line")
    good: list[tuple[dict, list[dict]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(track(lines, total=len(lines), description="ingest jsonl"), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(RecordError(where, [f"not valid JSON ({e.msg} at column {e.colno}); truncated line?"], line))
            continue
        if isinstance(rec, dict) and isinstance(rec.get("episode_id"), str):
            where += f" (episode_id {rec['episode_id']})"
        try:
            validate(rec, "episode.v1.json")
        except ValidationError as ve:
            bad.append(RecordError(where, ve.errors, rec))
            continue
        task_id = str(rec["task_id"])
        trial = rec.get("trial", 0)
        eid = rec.get("episode_id") or f"{source}:{task_id}:{trial}:{lineno}"
        if eid in seen:
            bad.append(RecordError(where, [f"episode_id: duplicate {eid!r} (first on line {seen[eid]})"], rec))
            continue
        seen[eid] = lineno
        reward = float(rec["reward"])
        msgs = _jsonl_messages(rec["messages"])
        ep = {
            "episode_id": eid,
            "source": source,
            "env": rec.get("info", {}).get("env", "jsonl") if isinstance(rec.get("info"), dict) else "jsonl",
            "domain": rec.get("domain"),
            "task_id": task_id,
            "task_family": (rec.get("info") or {}).get("task_family"),
            "trial": trial,
            "seed": rec.get("seed"),
            "reward": reward,
            "success": bool(rec["success"]) if "success" in rec else abs(reward - 1.0) <= SUCCESS_TOL,
            "termination_reason": rec.get("termination_reason"),
            "n_turns": sum(1 for m in msgs if m["role"] == "assistant"),
            "messages": msgs,
            "tools": rec.get("tools"),
            "reference_actions": rec.get("reference_actions"),
            "info": rec.get("info"),
        }
        good.append((ep, tool_call_rows(eid, msgs)))
    return good, bad


# ----------------------------------------------------------------------------- run


def _dump(v: Any) -> str | None:
    return None if v is None else json.dumps(v, ensure_ascii=False)


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    cfg = prepared.config
    path = Path(cfg["path"])
    parse = _parse_tau2 if cfg["format"] == "tau2" else _parse_jsonl
    good, bad = parse(path, cfg["source"])
    if bad and cfg["on_error"] == "fail":
        shown = "\n".join(f"  {b}" for b in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise InputError(
            f"{path}: {len(bad)} bad record{'s' if len(bad) != 1 else ''}; nothing was written:\n{shown}{more}",
            hint="fix the file, or pass --on-error skip to ingest the good records and get rejects.jsonl",
        )
    if not good:
        raise InputError(f"{path}: no valid records (all {len(bad)} rejected); nothing was written")
    with store.writer(
        "rollouts", NAME, prepared.config, prepared.inputs, name=name, overrides=overrides, id=prepared.id, replace=replace
    ) as w:
        episodes = []
        calls: list[dict] = []
        for ep, rows in good:
            ep = dict(ep)
            ep["n_tool_calls"] = len(rows)
            for k in ("messages", "tools", "reference_actions", "info"):
                ep[k] = _dump(ep[k])
            episodes.append(ep)
            calls.extend(rows)
        write_tables(w.path, episodes, calls)
        if bad:
            with open(w.path / layout.REJECTS, "w", encoding="utf-8") as f:
                for b in bad:
                    f.write(json.dumps({"where": b.where, "errors": b.problems, "record": b.raw}, default=str) + "\n")
        n_succ = sum(1 for ep, _ in good if ep["success"])
        w.summary.update(
            {
                "episodes": len(good),
                "successes": n_succ,
                "failures": len(good) - n_succ,
                "tool_calls": len(calls),
                "rejected": len(bad),
                "format": cfg["format"],
                "source": cfg["source"],
            }
        )
    return {"rollouts": w.artifact}
