"""What a target conversation needs: the slot of the expert whose capability it lacks, from a diagnosis's labels
(majority over labelling runs) or the rules detectors. MoE gates learn to route a target's turns by it."""

from __future__ import annotations

from typing import Any


def need_slot(labels: dict[str, str], names: list[str]) -> int:
    """The slot a target conversation needs: the first expert (adapters' order) whose capability it LACKS, else 0.

    Only LACKING counts: a capability the conversation shows (PRESENT) is one the base has there, and the rules
    detectors call tool-calling precision needed by every conversation that calls a tool, so PRESENT would send
    nearly every target turn to that expert."""
    from trace_cli.analysts.base import LACKING

    return next((i for i, n in enumerate(names, start=1) if labels.get(n) == LACKING), 0)


def by_need(episodes: list[dict[str, Any]], names: list[str]) -> list[int]:
    """Slots of target episodes from the rules detectors (which read the episodes' reference actions)."""
    from trace_cli.analysts.rules import needs

    return [need_slot(needs(ep, names), names) for ep in episodes]


def diagnosed(diag, rollouts, names: list[str]):
    """(episode, slot) of a diagnosis's rollouts, the slot from its labels (majority over labelling runs)."""
    from collections import Counter

    import pyarrow.parquet as pq

    from trace_cli.store.layout import LABELS as LABELS_FILE
    from trace_cli.store.rollouts import read_episodes

    votes: dict[tuple[str, str], Counter] = {}
    for r in pq.read_table(
        diag.path / LABELS_FILE, columns=["episode_id", "capability", "label"]
    ).to_pylist():
        if r["capability"] in names:
            votes.setdefault((r["episode_id"], r["capability"]), Counter())[r["label"]] += 1
    out = []
    for ep in read_episodes(rollouts.path):
        labels = {
            c: votes[(ep["episode_id"], c)].most_common(1)[0][0]
            for c in names
            if (ep["episode_id"], c) in votes
        }
        out.append((ep, need_slot(labels, names)))
    return out


def as_episode(r) -> dict[str, Any]:
    """What the rules detectors read of an episode, from a fresh rollout result."""
    return {
        "episode_id": f"{r.task_id}:{r.trial}",
        "task_id": r.task_id,
        "success": r.success,
        "reward": r.reward,
        "messages": r.messages,
        "reference_actions": r.metadata.get("reference_actions"),
    }
