"""OpenAI-format JSONL episodes (schemas/episode.v1.json): the writer (`trace export jsonl`) and the reader
(`trace ingest jsonl`), inverses of each other.

Messages are OpenAI chat messages: assistant `tool_calls` carry `arguments` as a JSON string, tool results
name their call by `tool_call_id`. The env and task family, which the schema has no field for, go to
`info` (where the reader takes them back). The reader accepts OpenAI's `developer` role (stored as `system`),
keeps arguments that are not JSON as raw text, and checks every record against the schema: with a check
compiled once from it (`formats.schema_check`), and with jsonschema, for the wording of the errors, only when
that check fails. Lines end at "\n" only (and a "\r" before it): U+2028, U+2029 and U+0085 may appear raw
inside JSON strings. Parsing is orjson's with `json` as the exact fallback (see `formats.codec`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from trace_cli.config.schemas import load_schema, validate
from trace_cli.errors import InputError, ValidationError, json_error
from trace_cli.formats.codec import (
    NOT_PARSED,
    TOO_DEEP,
    Inexact,
    Parsed,
    RecordError,
    check_raw,
    decode,
    encoders,
)
from trace_cli.formats.schema_check import compile_check
from trace_cli.progress import track
from trace_cli.store.metrics import is_success, reward_problem
from trace_cli.store.rollouts import tool_call_tuples

SCHEMA = "episode.v1.json"


def _message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if v is not None and k != "tool_calls"}
    if out.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        out["role"] = "system"
    if "content" in m and m["content"] is not None and not isinstance(m["content"], str):
        out["content"] = json.dumps(m["content"], ensure_ascii=False)
    elif "content" in m:
        out["content"] = m["content"]
    calls = []
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function", tc)
        args = fn.get("arguments")
        call: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": fn.get("name"),
                # OpenAI's wire format; raw text that was never JSON is kept as it was
                "arguments": args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False),
            },
        }
        if tc.get("id"):
            call = {"id": tc["id"], **call}
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    if "error" in out:
        out["error"] = bool(out["error"])
    for k in ("tool_call_id", "name"):
        if k in out and not isinstance(out[k], str):
            out[k] = str(out[k])
    return out


def record(ep: dict[str, Any]) -> dict[str, Any] | None:
    """One stored episode -> one JSONL record, or None when it has no reward (the schema requires one)."""
    if ep.get("reward") is None:
        return None
    rec: dict[str, Any] = {"kind": "episode", "episode_id": ep["episode_id"], "task_id": ep["task_id"]}
    for k in ("domain", "termination_reason"):
        if ep.get(k) is not None:
            rec[k] = ep[k]
    if ep.get("trial") is not None:
        rec["trial"] = int(ep["trial"])
    rec["seed"] = ep.get("seed")
    rec["reward"] = float(ep["reward"])
    if ep.get("success") is not None:
        rec["success"] = bool(ep["success"])
    acts = [
        {**a, "arguments": a.get("arguments") if isinstance(a.get("arguments"), dict) else {}}
        for a in ep.get("reference_actions") or []
        if isinstance(a, dict) and isinstance(a.get("name"), str)
    ]
    if acts:
        rec["reference_actions"] = acts
    if isinstance(ep.get("tools"), list):
        rec["tools"] = ep["tools"]
    info = dict(ep.get("info") or {})
    for k in ("env", "task_family"):
        if ep.get(k) is not None:
            info[k] = ep[k]
    rec["info"] = info
    rec["messages"] = [_message(m) for m in ep.get("messages") or []] or [{"role": "system", "content": ""}]
    return rec


def lines(episodes: list[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """The JSONL lines (no newline) and counts for the summary."""
    out = []
    for ep in episodes:
        rec = record(ep)
        if rec is not None:
            out.append(json.dumps(rec, ensure_ascii=False))
    return out, {"episodes": len(out), "skipped": len(episodes) - len(out)}


# ----------------------------------------------------------------------------- reading


@cache
def episode_check():
    """schemas/episode.v1.json compiled into a check (once): True proves a record valid."""
    return compile_check(load_schema(SCHEMA), SCHEMA)


def _fast_args(s: str) -> Any:
    """orjson for a string of call arguments; `Inexact` when only `json` reads it (NaN, ...)."""
    try:
        return orjson.loads(s)
    except orjson.JSONDecodeError:
        json.loads(s)  # raises JSONDecodeError when `json` rejects it too: then it is kept raw
        raise Inexact from None


def _read_messages(raw: list[dict[str, Any]], fast: bool = False) -> list[dict[str, Any]]:
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


def parse(path: Path, source: str) -> Parsed:
    """Good records as (episode row with its JSON columns encoded, tool-call rows as tuples), and the bad ones.

    Lines end at "\n" only (and a "\r" before it): U+2028, U+2029 and U+0085 may appear raw inside JSON strings.
    """
    data = path.read_bytes()
    good: list[tuple[dict, list[tuple]]] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    numbered = enumerate(
        track(_split_lines(data), total=data.count(b"\n") + 1, description="ingest jsonl"), 1
    )
    for lineno, line in numbered:
        if not line:
            continue
        try:
            out = _line(line, lineno, source, seen, data, path)
        except RecursionError:
            out = RecordError(f"line {lineno}", [TOO_DEEP], str(line[:200], "utf-8", "replace") + "…")
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


def _line(line: memoryview, lineno: int, source: str, seen: dict[str, int], data: bytes, path: Path):
    """One line: None when blank, else the good record or its RecordError."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        rec = NOT_PARSED
    if rec is not NOT_PARSED:
        try:
            return read_record(rec, lineno, source, seen, fast=True)
        except Inexact:
            pass
    # what orjson rejects or may have changed: `json`, exactly as before (values and messages)
    try:
        text = str(line, "utf-8")
    except UnicodeDecodeError:
        decode(data, path)  # raises, naming the file's first bad byte (the earlier lines were good)
        raise
    if not text.strip():
        return None  # only Unicode white space
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        return RecordError(
            f"line {lineno}", [f"not valid JSON ({e.msg} at column {e.colno}); truncated line?"], text
        )
    except ValueError as e:  # a number too long to convert
        return RecordError(f"line {lineno}", [f"not valid JSON here ({json_error(e)})"], text)
    return read_record(rec, lineno, source, seen, fast=False)


def _split_lines(data: bytes) -> Iterator[memoryview]:
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


def read_record(
    rec: Any, lineno: int, source: str, seen: dict[str, int], *, fast: bool
) -> tuple[dict, list[tuple]] | RecordError:
    """One parsed line -> (episode row, tool-call rows), or its RecordError. `seen` is updated only on success.
    `fast`: `rec` was parsed by orjson (`Inexact` where that may show; see `formats.codec`)."""
    where = f"line {lineno}"
    if isinstance(rec, dict) and isinstance(rec.get("episode_id"), str):
        where += f" (episode_id {rec['episode_id']})"
    if not episode_check()(rec):
        try:
            validate(rec, SCHEMA)
        except ValidationError as ve:
            if fast:
                check_raw(rec)
            return RecordError(where, ve.errors, rec)
    task_id, trial, seed = rec["task_id"], rec.get("trial", 0), rec.get("seed")
    if fast and float in (type(task_id), type(trial), type(seed)):
        raise Inexact  # an integer beyond 64 bits, or a float the schema accepts as an integer (1.0)
    task_id = str(task_id)
    eid = rec.get("episode_id") or f"{source}:{task_id}:{trial}:{lineno}"
    if eid in seen:
        if fast:
            check_raw(rec)
        return RecordError(where, [f"episode_id: duplicate {eid!r} (first on line {seen[eid]})"], rec)
    reward = float(rec["reward"])
    if bad_reward := reward_problem(reward):
        if fast:
            check_raw(rec)
        return RecordError(where, [f"reward: {bad_reward}"], rec)
    msgs = _read_messages(rec["messages"], fast)
    enc, dumps = encoders(fast)
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
