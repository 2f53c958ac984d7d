"""τ²-bench results JSON (`Results`: info, tasks, simulations) from stored episodes; inverse of `ingest tau2`.

Follows τ²-bench's pydantic models (src/tau2/data_model/simulation.py, message.py, tasks.py): messages are
`{role, content, tool_calls: [{id, name, arguments: <object>, requestor}], turn_idx}` and tool results
`{id, role: "tool", content, requestor, error, turn_idx}`; the leading system message becomes the policy
(`info.environment_info.policy`, or the run's own `policy` when runs differ), as ingest reads it back.
What τ²-bench has no field for (our termination reasons, env, task family, reward components) goes to the
run's `info.trace`, which ingest ignores; termination reasons outside τ²-bench's enum are mapped to it.

Episodes ingested from τ²-bench keep what they came from (`info.tau2`, written by `formats.tau2_read`): each
run's own fields and, per message, what differs from the message this module writes (`patch`); the file's
`info`, `tasks` and top-level fields ride on its first run, with the runs τ²-bench excludes from its metrics.
Export writes them back as they were, so ingest -> export of a τ²-bench file gives the same JSON document.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

# τ²-bench's TerminationReason values
TERMINATIONS = frozenset(
    (
        "user_stop",
        "agent_stop",
        "max_steps",
        "timeout",
        "too_many_errors",
        "agent_error",
        "user_error",
        "infrastructure_error",
        "context_window_exceeded",
        "unexpected_error",
    )
)
_TERMINATION_MAP = {"max_turns": "max_steps"}  # else: an agent-side ending (transfer, env_done, ...)
_RUN_FIELDS = ("agent_cost", "user_cost", "agent_usage", "timestamp", "mode")
_REWARD_FIELDS = ("db_check", "reward_basis", "reward_breakdown")
ORIGINAL = "tau2"  # the key of an ingested episode's τ²-bench original in its `info`
NATIVE = "tau2_env"  # the key of a tau2-* environment episode's τ² task and settings in its `info`
# the user of runs with `user=scripted`, as their exported file names it: never a τ²-bench score
SCRIPTED_USER = "trace-scripted-user (deterministic, not τ²-bench's user simulator: NOT a τ²-bench score)"


def patch(orig: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """What turns `made` into `orig` (both objects): the keys in `orig`'s order, the values that differ."""
    out: dict[str, Any] = {"keys": list(orig)}
    changed = {k: v for k, v in orig.items() if k not in made or made[k] != v}
    if changed:
        out["set"] = changed
    return out


def apply(made: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """`patch`'s inverse: `made` with the original's keys, order and values."""
    changed = p.get("set") or {}
    return {k: changed[k] if k in changed else made.get(k) for k in p["keys"]}


def original_messages(stored: list[dict[str, Any]], kept: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's τ²-bench messages from its stored messages and what ingest kept of them (`keep_messages`)."""
    if "full" in kept:
        return kept["full"]
    _, made, _ = messages(stored)
    return [apply(m, p) for m, p in zip(made, kept["patches"], strict=True)]


def keep_messages(stored: list[dict[str, Any]], raw: list[Any]) -> dict[str, Any]:
    """What export needs to write a run's messages `raw` back from `stored` (its messages as ingested): per
    message the fields this module does not write the same; the whole list when they do not line up."""
    try:
        _, made, _ = messages(stored)
    except Exception:  # noqa: BLE001 - anything unusual is kept whole
        return {"full": raw}
    if len(made) != len(raw) or not all(isinstance(m, dict) for m in raw):
        return {"full": raw}
    return {"patches": [patch(r, m) for r, m in zip(raw, made, strict=True)]}


def termination(reason: str | None) -> str:
    if reason in TERMINATIONS:
        return reason
    return _TERMINATION_MAP.get(reason or "", "agent_stop")


def _arguments(args: Any) -> tuple[dict[str, Any], bool]:
    """A call's arguments as τ²-bench's object; (value, lossy) where a non-object (raw text) became {}."""
    if isinstance(args, dict):
        return args, False
    if isinstance(args, str):
        try:
            v = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):  # not JSON, a number too long, nested too deep
            return {}, True
        if isinstance(v, dict):
            return v, False
    return {}, True


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False)


def messages(msgs: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]], int]:
    """Stored OpenAI-style messages -> (policy, τ²-bench messages, count of calls whose arguments were lost).

    A call without an id gets one, and a tool result without `tool_call_id` answers the oldest unanswered
    call (the pairing ingest uses), so every result names its call."""
    policy = None
    start = 0
    if msgs and msgs[0].get("role") == "system":
        policy, start = _text(msgs[0].get("content")) or "", 1
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids not answered yet, oldest first
    requestor_of: dict[str, str] = {}
    lossy = 0
    for i, m in enumerate(msgs[start:]):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id") or (pending[0] if pending else f"call_missing_{i}")
            if cid in pending:
                pending.remove(cid)
            out.append(
                {
                    "id": cid,
                    "role": "tool",
                    "content": _text(m.get("content")),
                    "requestor": m.get("requestor") or requestor_of.get(cid, "assistant"),
                    "error": bool(m.get("error")),
                    "turn_idx": i,
                }
            )
            continue
        if role not in ("user", "assistant"):  # a system message later in the conversation
            out.append({"role": "system", "content": _text(m.get("content")), "turn_idx": i})
            continue
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content")), "tool_calls": None}
        calls = []
        for k, tc in enumerate(m.get("tool_calls") or []):
            fn = tc.get("function", tc)
            args, lost = _arguments(fn.get("arguments"))
            lossy += lost
            cid = tc.get("id") or f"call_{i}_{k}"
            req = tc.get("requestor") or ("user" if role == "user" else "assistant")
            requestor_of[cid] = req
            pending.append(cid)
            calls.append({"id": cid, "name": fn.get("name"), "arguments": args, "requestor": req})
        if calls:
            msg["tool_calls"] = calls
        if m.get("reasoning"):
            # where τ²-bench keeps a provider's reasoning: litellm's response in raw_data (ingest reads it)
            msg["raw_data"] = {"choices": [{"message": {"reasoning_content": m["reasoning"]}}]}
        msg["turn_idx"] = i
        out.append(msg)
    return policy, out, lossy


def tool_defs(tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """OpenAI tool list -> τ²-bench's `tool_defs` ({name: ToolSignature{name, doc, params}})."""
    if not tools:
        return None
    out: dict[str, Any] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.setdefault(
                fn["name"],
                {"name": fn["name"], "doc": fn.get("description") or "", "params": fn.get("parameters")},
            )
    return out or None


def _task(ep: dict[str, Any], msgs: list[dict[str, Any]]) -> dict[str, Any]:
    first_user = next((m.get("content") for m in msgs if m.get("role") == "user"), None)
    crit: dict[str, Any] = {}
    acts = [a for a in ep.get("reference_actions") or [] if isinstance(a, dict) and a.get("name")]
    if acts:
        crit["actions"] = [
            {
                "action_id": str(i),
                "requestor": a.get("requestor") or "assistant",
                "name": a["name"],
                "arguments": a.get("arguments") if isinstance(a.get("arguments"), dict) else {},
            }
            for i, a in enumerate(acts)
        ]
    info = ep.get("info") or {}
    if info.get("communicate_info"):
        crit["communicate_info"] = info["communicate_info"]
    task: dict[str, Any] = {
        "id": ep["task_id"],
        "user_scenario": {"instructions": _text(first_user) or ""},
    }
    if ep.get("task_family"):
        task["description"] = {"purpose": f"{ep.get('env') or ''} task family {ep['task_family']}".strip()}
    if crit:
        task["evaluation_criteria"] = crit
    return task


def results(
    episodes: list[dict[str, Any]],
    *,
    created_at: str | None = None,
    agent: str | None = None,
    max_steps: int | None = None,
    version: str = "",
) -> tuple[dict[str, Any], dict[str, int]]:
    """Episodes of one rollouts artifact -> (τ²-bench `Results` document, counts for the summary).

    Episodes without a reward are left out (τ²-bench cannot score them) and counted as `skipped`."""
    now = created_at or datetime.now(UTC).isoformat()
    scored = [e for e in episodes if e.get("reward") is not None]
    converted = [(e, *messages(e.get("messages") or [])) for e in scored]
    policies = Counter(p for _, p, _, _ in converted)
    env_policy = ""
    if len(policies) == 1:  # every run has the same policy (or none): once, at the environment
        env_policy = next(iter(policies)) or ""
    domains = Counter(e.get("domain") or e.get("env") or "unknown" for e in scored)
    domain = next(iter(domains)) if len(domains) == 1 else "mixed"
    tools: list[dict[str, Any]] = []
    for e in scored:
        tools.extend(e.get("tools") or [])
    tasks: dict[str, dict[str, Any]] = {}
    sims = []
    lossy = 0
    # episodes of trace's own tau2-* environments carry τ²'s task and run settings (`info.tau2_env`)
    natives = [(e.get("info") or {}).get(NATIVE) for e in scored]
    native = natives[0] if scored and all(isinstance(n, dict) for n in natives) else None
    for e, policy, msgs, lost in converted:
        lossy += lost
        info = e.get("info") or {}
        if e["task_id"] not in tasks:
            tasks[e["task_id"]] = info[NATIVE]["task"] if native else _task(e, e.get("messages") or [])
        reward_info: dict[str, Any] = {"reward": float(e["reward"])}
        if native and isinstance(info.get("breakdown"), dict):
            details = info["breakdown"].get("details") or {}
            if details.get("reward_basis"):
                reward_info["reward_basis"] = details["reward_basis"]
                reward_info["reward_breakdown"] = info["breakdown"].get("components") or {}
        rb = info.get("reward_breakdown")
        if isinstance(rb, dict):
            reward_info.update({k: rb[k] for k in _REWARD_FIELDS if rb.get(k) is not None})
        if isinstance(info.get("breakdown"), dict):  # an eval's verifier verdict (components, details)
            reward_info["info"] = info["breakdown"]
        sim: dict[str, Any] = {
            "id": e["episode_id"],
            "task_id": e["task_id"],
            "start_time": info.get("start_time") or now,
            "end_time": info.get("end_time") or now,
            "duration": float(info.get("duration") or 0.0),
            "termination_reason": termination(e.get("termination_reason")),
            "reward_info": reward_info,
            "messages": msgs,
            "trial": e.get("trial"),
            "seed": e.get("seed"),
            **{k: info[k] for k in _RUN_FIELDS if info.get(k) is not None},
        }
        if policy is not None and policy != env_policy:
            sim["policy"] = policy
        sim["info"] = {
            "trace": {
                k: v
                for k, v in (
                    ("env", e.get("env")),
                    ("domain", e.get("domain")),
                    ("task_family", e.get("task_family")),
                    ("termination_reason", e.get("termination_reason")),
                    ("source", e.get("source")),
                    ("success", e.get("success")),
                )
                if v is not None
            }
        }
        sims.append(sim)
    originals = [(e.get("info") or {}).get(ORIGINAL) for e in scored]
    if scored and all(isinstance(o, dict) for o in originals):
        # every run came from τ²-bench: the runs as they were, in their order
        sims = [_restored(e, o) for e, o in zip(scored, originals, strict=True)]
        docs = [o["document"] for o in originals if "document" in o]
        if len(docs) == 1 and len({o.get("doc") for o in originals}) == 1:
            return _document(docs[0], sims, originals), {
                "simulations": len(sims),
                "tasks": len(docs[0]["fields"].get("tasks") or []),
                "skipped": len(episodes) - len(scored),
                "lossy_arguments": 0,
            }
    trials = [e.get("trial") for e in scored if e.get("trial") is not None]
    agent_llm = next((e["info"]["agent_llm"] for e in scored if (e.get("info") or {}).get("agent_llm")), None)
    user_info: dict[str, Any] = {
        "implementation": "scripted" if agent is not None else "unknown",
        "llm": None,
    }
    if native:
        max_steps, domain = native["max_steps"], native["domain"]
        user_info = {"implementation": "user_simulator", "llm": native.get("user_model")}
        if not native.get("comparable"):
            user_info["implementation"] = SCRIPTED_USER
    doc = {
        "timestamp": now,
        "info": {
            "git_commit": f"trace-cli {version}".strip(),
            "num_trials": max(trials) + 1 if trials else 1,
            "max_steps": int(max_steps or max((len(m) for _, _, m, _ in converted), default=0)),
            "max_errors": int(native["max_errors"]) if native else 10,
            "user_info": user_info,
            "agent_info": {"implementation": "trace", "llm": agent_llm or agent},
            "environment_info": {"domain_name": domain, "policy": env_policy, "tool_defs": tool_defs(tools)},
            "seed": None,
        },
        "tasks": list(tasks.values()),
        "simulations": sims,
    }
    return doc, {
        "simulations": len(sims),
        "tasks": len(tasks),
        "skipped": len(episodes) - len(scored),
        "lossy_arguments": lossy,
    }


def _restored(e: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """An ingested run as τ²-bench wrote it."""
    sim = dict(o["sim"])
    if "messages" in o:
        sim["messages"] = original_messages(e.get("messages") or [], o["messages"])
    return sim


def _document(
    doc: dict[str, Any], sims: list[dict[str, Any]], originals: list[dict[str, Any]]
) -> dict[str, Any]:
    """The τ²-bench file the runs were ingested from: its top-level fields, with the runs (those τ²-bench
    excludes from its metrics among them) in the file's order."""
    order = [(o["index"], s) for o, s in zip(originals, sims, strict=True)]
    order += [(i, raw) for i, raw in doc.get("excluded") or []]
    out = dict(doc["fields"])
    out["simulations"] = [s for _, s in sorted(order, key=lambda t: t[0])]
    return out
