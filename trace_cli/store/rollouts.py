"""Reading and writing `rollouts` artifacts: the `episodes` and `tool_calls` Parquet tables.

Messages are stored as JSON in OpenAI chat format, normalised so every producer (τ²-bench ingest, JSONL
ingest, `trace eval`) looks the same to consumers: assistant `tool_calls` are
`{"id", "type": "function", "function": {"name", "arguments": <object, or the raw string if it was not JSON>}}`,
tool results are `{"role": "tool", "tool_call_id", "content", "error"}`; a tool call made by the user side
(τ²-bench telecom) carries `"requestor": "user"`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.store import layout
from trace_cli.store.tables import EPISODES_SCHEMA, TOOL_CALLS_SCHEMA


def tool_call_rows(episode_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tool call, paired with its result (by tool_call_id, else the next unclaimed tool message)."""
    call_ids = {tc.get("id") for m in messages for tc in (m.get("tool_calls") or []) if tc.get("id")}
    results: dict[str, dict[str, Any]] = {}
    unclaimed: list[tuple[int, dict[str, Any]]] = []
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            if m.get("tool_call_id"):
                results.setdefault(m["tool_call_id"], m)
            # a result that answers a known call id belongs to that call only; never pair it by position
            if m.get("tool_call_id") not in call_ids:
                unclaimed.append((i, m))
    used: set[int] = set()
    rows = []
    for turn, m in enumerate(messages):
        for k, tc in enumerate(m.get("tool_calls") or []):
            fn = tc.get("function", tc)
            res = results.get(tc.get("id") or "")
            if res is None:
                for j, tm in unclaimed:
                    if j > turn and id(tm) not in used:
                        res = tm
                        break
            if res is not None:
                used.add(id(res))
            args = fn.get("arguments")
            rows.append(
                {
                    "episode_id": episode_id,
                    "turn": turn,
                    "call_index": k,
                    "tool_name": fn.get("name"),
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                    "result": None if res is None else _text(res.get("content")),
                    "error": bool(res.get("error")) if res is not None else False,
                    "requestor": tc.get("requestor") or m.get("requestor") or m.get("role"),
                }
            )
    return rows


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False)


def write_tables(out_dir: Path, episodes: Iterable[dict[str, Any]], tool_calls: Iterable[dict[str, Any]]) -> None:
    """Write episodes.parquet and tool_calls.parquet with the stable schemas (missing columns -> NULL)."""
    ep = list(episodes)
    tc = list(tool_calls)
    pq.write_table(_table(ep, EPISODES_SCHEMA), out_dir / layout.EPISODES, compression="zstd")
    pq.write_table(_table(tc, TOOL_CALLS_SCHEMA), out_dir / layout.TOOL_CALLS, compression="zstd")


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def read_episodes(artifact_dir: Path) -> list[dict[str, Any]]:
    """Episodes of a rollouts artifact as dicts, with `messages`, `tools`, `reference_actions`, `info` decoded."""
    rows = pq.read_table(artifact_dir / layout.EPISODES).to_pylist()
    for r in rows:
        for k in ("messages", "tools", "reference_actions", "info"):
            if r.get(k) is not None:
                r[k] = json.loads(r[k])
    return rows
