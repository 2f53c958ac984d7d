"""OpenAI-format JSONL episodes (schemas/episode.v1.json) from stored episodes; inverse of `ingest jsonl`.

Messages are OpenAI chat messages: assistant `tool_calls` carry `arguments` as a JSON string, tool results
name their call by `tool_call_id`. The env and task family, which the schema has no field for, go to
`info` (where ingest reads them back).
"""

from __future__ import annotations

import json
from typing import Any


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
