"""What a target conversation needs, turn by turn: MoE gates learn to route a target's turns by it.

The rule (the base's conversations on the target: a diagnosis's rollouts, `moe.data` entries with expert
'needs', `moe.test_rollouts`, generated target rollouts):
- the conversation's expert is the first (adapters' order) whose capability it LACKS: from a diagnosis's labels
  (majority over labelling runs) or from the rules detectors; it lacks none of theirs -> base on every turn;
- its turns are labelled base up to the turn where the rules detector of that capability locates the problem,
  and the expert from that turn on. The detector locates it at the first assistant turn whose prefix of the
  conversation (through the tool results answering that turn) it already labels LACKING: the write made without
  reading its target, the call that was malformed, the first of the required operations after which the rest
  went missing. Where it cannot (no detector for the capability, or the prefixes never show the problem, as when
  a diagnosis's labels came from an LLM) every turn carries the expert.
"""

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


def problem_turn(episode: dict[str, Any], capability: str) -> int | None:
    """The assistant turn (0-based, among assistant messages) where the rules detector of `capability` first
    labels the conversation LACKING, read prefix by prefix; None when it has no detector or never does."""
    from trace_cli.analysts.base import LACKING, Trajectory
    from trace_cli.analysts.rules import DETECTORS

    det = DETECTORS.get(capability)
    if det is None:
        return None
    msgs = episode.get("messages") or []
    turns = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    for k in range(len(turns)):
        end = turns[k + 1] if k + 1 < len(turns) else len(msgs)  # with the tool results answering turn k
        if det(Trajectory.from_episode({**episode, "messages": msgs[:end]}))[0] == LACKING:
            return k
    return None


def turn_labels(episode: dict[str, Any], slot: int, names: list[str]) -> list[int]:
    """One slot per assistant turn of a target conversation whose expert is `slot` (the module's rule)."""
    n = sum(1 for m in episode.get("messages") or [] if m.get("role") == "assistant")
    at = problem_turn(episode, names[slot - 1]) if slot else None
    return [0] * n if not slot else [0 if at is not None and k < at else slot for k in range(n)]


def diagnosed(diag, rollouts, names: list[str]):
    """(episode, slot) of a diagnosis's rollouts, the slot from its labels (majority over labelling runs)."""
    from collections import Counter

    from trace_cli.store.layout import LABELS as LABELS_FILE
    from trace_cli.store.rollouts import read_episodes, read_table

    votes: dict[tuple[str, str], Counter] = {}
    for r in read_table(diag.path / LABELS_FILE).select(["episode_id", "capability", "label"]).to_pylist():
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


def diagnosed_rollouts(diag, store):
    """The rollouts artifact a diagnosis labelled (its `rollouts` input), or None when it records none."""
    ro = next((i for i in diag.manifest.get("inputs", []) if i.get("role") == "rollouts"), None)
    return None if ro is None else store.resolve(f"store://rollouts/{ro['id']}", kind="rollouts")


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
