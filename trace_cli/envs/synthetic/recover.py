"""Recover a target's tool schemas (OpenAI function format) from a rollouts artifact.

When the episodes carry tool definitions (`tools`), those are the schemas. Otherwise they are inferred from
the agent's tool calls: the tool names, argument names, JSON types seen for each argument (arrays with the
types of their items), and `required` = the arguments present in every observed call. Calls made by the
user side (τ²-bench telecom) are not the agent's tools and are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


class _Seen:
    """The values observed for one argument: their types, and (for arrays) their items'."""

    def __init__(self) -> None:
        self.types: set[str] = set()
        self.items: _Seen | None = None

    def add(self, v: Any) -> None:
        t = _json_type(v)
        self.types.add(t)
        if t == "array":
            self.items = self.items or _Seen()
            for x in v:
                self.items.add(x)

    def schema(self) -> dict[str, Any]:
        types = set(self.types)
        if {"integer", "number"} <= types:
            types.discard("integer")
        out: dict[str, Any] = {"type": sorted(types)[0] if len(types) == 1 else sorted(types)}
        if "array" in types and self.items is not None and self.items.types:
            out["items"] = self.items.schema()
        return out


def _episodes(source: Any) -> list[dict[str, Any]]:
    from trace_cli.store.rollouts import read_episodes

    if isinstance(source, list):
        return source
    path = getattr(source, "path", source)
    return read_episodes(Path(path))


def _calls(ep: dict[str, Any]):
    for m in ep.get("messages") or []:
        if m.get("role") != "assistant" or m.get("requestor") == "user":
            continue
        for tc in m.get("tool_calls") or []:
            if tc.get("requestor") == "user":
                continue
            fn = tc.get("function", tc)
            name, args = fn.get("name"), fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    continue
            if isinstance(name, str) and name and isinstance(args, dict):
                yield name, args


def recover_tools(source: Any) -> dict[str, dict[str, Any]]:
    """Tool name -> OpenAI function schema, from a rollouts artifact (or its directory, or decoded episodes)."""
    eps = _episodes(source)
    declared: dict[str, dict[str, Any]] = {}
    for ep in eps:
        for t in ep.get("tools") or []:
            fn = t.get("function", t) if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                declared.setdefault(
                    fn["name"], t if "function" in t else {"type": "function", "function": fn}
                )
    if declared:
        return {k: declared[k] for k in sorted(declared)}
    seen: dict[str, dict[str, _Seen]] = {}
    present: dict[str, list[set[str]]] = {}
    for ep in eps:
        for name, args in _calls(ep):
            props = seen.setdefault(name, {})
            for k, v in args.items():
                props.setdefault(k, _Seen()).add(v)
            present.setdefault(name, []).append(set(args))
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(seen):
        calls = present[name]
        required = sorted(set.intersection(*calls)) if calls else []
        out[name] = {
            "type": "function",
            "function": {
                "name": name,
                "description": f"Recovered from {len(calls)} observed call{'s' if len(calls) != 1 else ''}.",
                "parameters": {
                    "type": "object",
                    "properties": {k: s.schema() for k, s in sorted(seen[name].items())},
                    "required": required,
                },
            },
        }
    return out
