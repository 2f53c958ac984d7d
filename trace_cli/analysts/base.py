"""Shared pieces of the analysts: label values, candidate capabilities, and a trajectory view that turns a
stored episode (OpenAI-format messages + reference actions) into the facts detectors and prompts need."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

NA, PRESENT, LACKING, ERROR = "NA", "PRESENT", "LACKING", "ERROR"
LABELS = (NA, PRESENT, LACKING)

READ_PREFIXES = ("get_", "find_", "list_", "search_", "calculate", "check_", "lookup_", "think", "read_")
TERMINAL_TOOLS = ("transfer_to_human_agents", "transfer_to_human", "respond_to_user", "done")
SCHEMA_ERROR_MARKERS = (
    "missing required argument",
    "unexpected argument",
    "must be of type",
    "must be one of",
    "not valid json",
    "malformed tool call",
    "unknown tool",
    "needs at least",
    "arguments must be",
    "validation error",
    "invalid format",
    "field required",
)


@dataclass
class Candidate:
    name: str
    description: str
    distractor: bool = False
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "description": self.description}
        if self.distractor:
            d["distractor"] = True
        if self.examples:
            d["examples"] = self.examples
        return d


@dataclass
class Label:
    episode_id: str
    capability: str
    run: int
    label: str  # NA | PRESENT | LACKING | ERROR (the analyst failed; excluded from the counts)
    rationale: str


def is_read(tool: str) -> bool:
    return tool.startswith(READ_PREFIXES)


def is_write(tool: str) -> bool:
    return bool(tool) and not is_read(tool) and tool not in TERMINAL_TOOLS


@dataclass
class Call:
    index: int  # position in the message list
    name: str
    arguments: dict[str, Any] | str
    result: str | None
    error: bool
    requestor: str


@dataclass
class Trajectory:
    """A read-only view over one episode for detectors and prompts."""

    episode_id: str
    task_id: str
    success: bool
    reward: float
    messages: list[dict[str, Any]]
    reference: list[dict[str, Any]] | None

    @classmethod
    def from_episode(cls, ep: dict[str, Any]) -> Trajectory:
        def load(v: Any) -> Any:
            return json.loads(v) if isinstance(v, str) else v

        return cls(
            ep["episode_id"],
            str(ep.get("task_id")),
            bool(ep["success"]),
            float(ep.get("reward") or 0.0),
            load(ep.get("messages")) or [],
            load(ep.get("reference_actions")),
        )

    def calls(self) -> list[Call]:
        results: dict[str, dict[str, Any]] = {}
        for m in self.messages:
            if m.get("role") == "tool" and m.get("tool_call_id"):
                results[m["tool_call_id"]] = m
        out = []
        for i, m in enumerate(self.messages):
            if m.get("role") not in ("assistant",) or m.get("requestor") == "user":
                continue
            for tc in m.get("tool_calls") or []:
                if tc.get("requestor") == "user":
                    continue
                fn = tc.get("function", tc)
                res = results.get(tc.get("id") or "")
                if res is None:  # unpaired: the next tool message
                    res = next((x for x in self.messages[i + 1 :] if x.get("role") == "tool"), None)
                out.append(
                    Call(
                        i,
                        fn.get("name") or "",
                        fn.get("arguments"),
                        None if res is None else str(res.get("content")),
                        bool(res and (res.get("error") or str(res.get("content", "")).startswith("Error"))),
                        "assistant",
                    )
                )
        return out

    def malformed_turns(self) -> list[str]:
        return [
            str(m.get("content"))
            for m in self.messages
            if m.get("role") == "tool" and "malformed tool call" in str(m.get("content", ""))
        ]

    def agent_texts(self) -> list[str]:
        return [
            m.get("content") or ""
            for m in self.messages
            if m.get("role") == "assistant" and not m.get("tool_calls") and (m.get("content") or "").strip()
        ]

    def user_texts(self) -> list[str]:
        return [m.get("content") or "" for m in self.messages if m.get("role") == "user"]

    def reference_writes(self) -> list[dict[str, Any]]:
        return [
            a
            for a in (self.reference or [])
            if a.get("requestor", "assistant") == "assistant" and is_write(a.get("name", ""))
        ]

    def render(self, max_result_chars: int = 300) -> str:
        """Compact text for LLM analysts: one line per turn, tool results truncated."""
        lines = [f"task {self.task_id}: {'SUCCESS' if self.success else 'FAILURE'} (reward {self.reward:g})"]
        for m in self.messages:
            role = m.get("role")
            if role == "system":
                continue
            if role == "tool":
                c = str(m.get("content"))
                lines.append(
                    f"  tool result: {c[:max_result_chars]}{'…' if len(c) > max_result_chars else ''}"
                )
                continue
            if m.get("tool_calls"):
                for tc in m["tool_calls"]:
                    fn = tc.get("function", tc)
                    args = fn.get("arguments")
                    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                    lines.append(f"  {role} calls {fn.get('name')}({args})")
            if (m.get("content") or "").strip():
                lines.append(f"  {role}: {m['content'].strip()}")
        if self.reference:
            lines.append(
                "reference actions: "
                + "; ".join(
                    f"{a.get('name')}({json.dumps(a.get('arguments', {}), ensure_ascii=False)})"
                    for a in self.reference
                )
            )
        return "\n".join(lines)
