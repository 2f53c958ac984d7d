"""One simulation (run) of a τ²-bench results file: its fields read and checked, each problem naming its field;
its task id when the run names none; its task's reference actions; and why τ²-bench would leave it out of its
metrics. `tau2_read.records` puts these together for a whole file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from trace_cli.formats.codec import type_name
from trace_cli.store.metrics import reward_problem


def _messages(raw: list[Any], where: str) -> tuple[list[dict[str, Any]], list[str]]:
    problems: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            problems.append(f"messages[{i}]: expected an object, got {type_name(m)}")
            continue
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            problems.append(f"messages[{i}].role: {role!r} is not one of system/user/assistant/tool")
            continue
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            problems.append(f"messages[{i}].content: expected a string or null, got {type_name(content)}")
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
                problems.append(f"messages[{i}].tool_calls: expected an array, got {type_name(calls)}")
            else:
                norm = []
                for k, tc in enumerate(calls):
                    if not isinstance(tc, dict) or not isinstance(tc.get("name"), str):
                        problems.append(f"messages[{i}].tool_calls[{k}].name: missing or not a string")
                        continue
                    args = tc.get("arguments", {})
                    if not isinstance(args, dict):
                        problems.append(
                            f"messages[{i}].tool_calls[{k}].arguments: expected an object, got {type_name(args)}"
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


def _task_id_for(s: dict[str, Any], tasks: dict[str, Any], by_index: dict[str, Any]) -> tuple[Any, bool]:
    """A task id for a run that has none: the run's embedded task, the file's simulation_index, the file's
    only task; else a stable id derived from the first user message (runs of one task share it), marked in
    `info.task_id_derived` and counted in the summary."""
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


@dataclass
class _Simulation:
    """The fields of one simulation as read (valid only where its problem list is empty)."""

    task_id: Any
    derived_task: bool
    trial: Any
    seed: Any
    reward: float | None
    reward_info: Any
    termination: Any
    raw_messages: Any
    messages: list[dict]


def read_simulation(
    s: dict, where: str, seen: dict[str, int], tasks, by_index
) -> tuple[list[str], _Simulation]:
    """A simulation's problems (each naming its field), and its fields."""
    sid = s.get("id")
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
        problems.append(f"task_id: not a string (got {type_name(task_id)})")
    trial = s.get("trial")
    if trial is not None and (not isinstance(trial, int) or isinstance(trial, bool)):
        problems.append(f"trial: expected an integer or null, got {type_name(trial)}")
    seed = s.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        problems.append(f"seed: expected an integer or null, got {type_name(seed)}")
    ri = s.get("reward_info")
    reward = None
    if ri is not None and not isinstance(ri, dict):
        problems.append(f"reward_info: expected an object, got {type_name(ri)}")
    elif isinstance(ri, dict) and ri.get("reward") is not None:
        if not isinstance(ri["reward"], int | float) or isinstance(ri["reward"], bool):
            problems.append(f"reward_info.reward: expected a number, got {type_name(ri['reward'])}")
        else:
            reward = float(ri["reward"])
            if bad_reward := reward_problem(reward):
                problems.append(f"reward_info.reward: {bad_reward}")
    term = s.get("termination_reason")
    if term is not None and not isinstance(term, str):
        problems.append(f"termination_reason: expected a string, got {type_name(term)}")
    raw_msgs = s.get("messages")
    msgs: list[dict] = []
    if raw_msgs is not None and not isinstance(raw_msgs, list):
        problems.append(f"messages: expected an array, got {type_name(raw_msgs)}")
    elif raw_msgs:
        msgs, mp = _messages(raw_msgs, where)
        problems += mp
    return problems, _Simulation(task_id, derived_task, trial, seed, reward, ri, term, raw_msgs, msgs)


def excluded_because(term: Any, reward: float | None) -> str | None:
    """Why τ²-bench leaves a run out of its metrics (agent_metrics.get_metrics_df drops infrastructure errors; a
    run without a reward has nothing to score), or None."""
    if term == "infrastructure_error":
        return "termination_reason is infrastructure_error (τ²-bench excludes these runs from its metrics)"
    if reward is None:
        return "no reward_info.reward (the run was not evaluated; τ²-bench cannot score it)"
    return None


def reference_actions(task: dict | None) -> list[dict] | None:
    """A task's reference actions (evaluation_criteria.actions: name, arguments, requestor), or None."""
    acts = ((task or {}).get("evaluation_criteria") or {}).get("actions") or None
    if not acts:
        return None
    return [
        {"name": a.get("name"), "arguments": a.get("arguments", {}), "requestor": a.get("requestor")}
        for a in acts
    ]
