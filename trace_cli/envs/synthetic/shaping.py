"""Environments shaped by the diagnosis: a template's task mix comes from the target conversations that the
diagnosis labelled LACKING for its capability.

`profile(episodes)` counts, from each conversation's reference actions (what the task needed, not what the agent
did): the kinds of its writes (`cancel`, `return`, `exchange`, `address`), its refused requests (a reference
message that says a request cannot be done: the order was read and nothing was written), its requests (writes +
refusals), whether a lookup came before the first write, and the refunds to a gift card; and, from the user's
messages where the episodes carry them, how each returned item was described (`return_described`: most
expensive, cheapest, most recent, by an option, by its name). A template's `shape`
turns the profile into pinned knobs (calibration keeps pins and moves the rest of the level): which operations,
how many requests, the refusal share. The target's task generator is never imported: only the conversations the
diagnosis already paid for are read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

WRITE_KIND = {
    "cancel_pending_order": "cancel",
    "return_delivered_order_items": "return",
    "exchange_delivered_order_items": "exchange",
    "modify_user_address": "address",
    "modify_pending_order_address": "address",
}
REFUSAL = re.compile(r"\b(cannot|can't|can not)\b|\bonly (pending|delivered)\b", re.IGNORECASE)
# how a user described the item to return (structured_data_reasoning's kinds), first match wins
DESCRIBED = (
    ("most_expensive", re.compile(r"most expensive|cost the most", re.IGNORECASE)),
    ("cheapest", re.compile(r"cheapest|cost the least", re.IGNORECASE)),
    ("most_recent", re.compile(r"most recent|latest", re.IGNORECASE)),
    ("by_option", re.compile(r"\bthe one with\b|\breturn the [^.,]+ with \w", re.IGNORECASE)),
    ("by_name", re.compile(r"\b[Rr]eturn the [A-Z][^.,]*? (from|I got in) (my )?order\b")),
)


def _task(actions: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [a for a in actions if "name" in a]
    writes = [a for a in calls if a["name"] in WRITE_KIND]
    first = next((i for i, a in enumerate(calls) if a["name"] in WRITE_KIND), len(calls))
    refused = sum(1 for a in actions if "content" in a and REFUSAL.search(str(a["content"])))
    gift = [
        str((a.get("arguments") or {}).get("payment_method_id", "")).startswith("gift_card")
        for a in writes
        if a["name"] == "return_delivered_order_items"
    ]
    return {
        "kinds": [WRITE_KIND[a["name"]] for a in writes],
        "refused": refused,
        "lookup": any(a["name"].startswith(("get_", "search_")) for a in calls[:first]) and bool(writes),
        "gift": gift,
    }


def _described(ep: dict[str, Any]) -> list[str]:
    """How the user's messages describe the items to return (`DESCRIBED`'s kinds), one per sentence that asks
    for a return; none when the conversation has no messages or returns nothing."""
    refs = ep.get("reference_actions") or []
    if not any(a.get("name") == "return_delivered_order_items" for a in refs):
        return []
    messages = ep.get("messages") or []
    if isinstance(messages, str):
        import json

        messages = json.loads(messages)
    text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    out = []
    for sentence in re.split(r"(?<=[.?!])\s+", text):
        if "return" in sentence.lower():
            out += [k for k, pat in DESCRIBED if pat.search(sentence)][:1]
    return out


def profile(episodes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The task mix of conversations (their `reference_actions`); `tasks` 0 when none has any."""
    episodes = [ep for ep in episodes if ep.get("reference_actions")]
    tasks = [_task(ep["reference_actions"]) for ep in episodes]
    described = Counter(k for ep in episodes for k in _described(ep))
    kinds = Counter(k for t in tasks for k in t["kinds"])
    gifts = [g for t in tasks for g in t["gift"]]
    n = max(1, len(tasks))
    return {
        "tasks": len(tasks),
        "kinds": dict(sorted(kinds.items())),
        "refused": sum(t["refused"] for t in tasks),
        "writes_per_task": [len(t["kinds"]) for t in tasks],
        # cancel/return requests per task, refused ones included (a refusal in the shop is a cancel/return)
        "order_requests_per_task": [
            sum(k in ("cancel", "return") for k in t["kinds"]) + t["refused"] for t in tasks
        ],
        "lookup_before_write": round(sum(t["lookup"] for t in tasks) / n, 3),
        "gift_card_share": round(sum(gifts) / len(gifts), 3) if gifts else None,
        # how the users described the items they returned (from their messages, where the episodes have them)
        "return_described": dict(sorted(described.items())),
    }


def clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def share(part: int, whole: int, lo: float = 0.05, hi: float = 0.95) -> float:
    """part / whole, kept inside [lo, hi] so that neither side of a mix disappears from training."""
    return round(clamp(part / whole, lo, hi), 2)


def shape_params(template, episodes: list[dict[str, Any]], min_tasks: int) -> dict[str, Any]:
    """{"profile", "params"} for a template from the LACKING conversations; params empty when fewer than
    `min_tasks` conversations have reference actions (too few to say what the mix is)."""
    prof = profile(episodes)
    params = template.shape(prof) if prof["tasks"] >= min_tasks else {}
    return {"profile": prof, "params": params, "min_tasks": min_tasks}


def shape_for(
    template, lacking: list[dict[str, Any]], min_tasks: int, given: dict[str, Any], **env: Any
) -> dict[str, Any]:
    """What `synthesize` records and starts calibration from: the profile of the LACKING conversations and the
    template's pins (knobs the config's params name are the config's; pins the template refuses with them are
    dropped, said on stderr and recorded as `refused`)."""
    import sys

    from trace_cli.errors import UsageError

    shape = shape_params(template, lacking, min_tasks)
    shape["lacking_conversations"] = len(lacking)
    if shape["profile"]["tasks"] < min_tasks:
        print(
            f"synthesize: not shaping {template.capability} by the diagnosis: {shape['profile']['tasks']} LACKING "
            f"conversation(s) with reference actions, fewer than shape_min_tasks {min_tasks}",
            file=sys.stderr,
        )
    shape["params"] = {k: v for k, v in shape["params"].items() if k not in given}
    try:
        template(**env, **shape["params"], **given)
    except UsageError as e:
        print(f"synthesize: not shaping {template.capability} by the diagnosis: {e}", file=sys.stderr)
        shape["params"], shape["refused"] = {}, str(e)
    return shape


__all__ = ["clamp", "profile", "shape_for", "shape_params", "share"]
