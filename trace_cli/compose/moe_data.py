"""The labelled transcripts the MoE gates learn from (`moe_train.Transcript`), with no new rollouts by default.

Sources, when `moe.data` is not given:
- each expert's own GRPO training episodes (kept in its adapter artifact, `training.episode_log`): those with a
  positive advantage in their seed group (reward above the group mean), every assistant turn labelled with that
  expert's slot;
- the base's conversations on the target: the diagnosed rollouts when compose gets `moe.diagnosis`, each turn
  labelled as `compose.needs` says (base before the turn where the conversation's missing capability shows,
  that expert from it on; base throughout when it lacks none of the experts' capabilities).
Only what these cannot give is generated with `moe.policy`: the target's conversations without a diagnosis, and
an expert's environment rollouts (its successes) for an adapter that kept no episodes (trained before it did).

`moe.data` entries replace them: a rollouts artifact per expert (every turn that expert's), 'base', or 'needs'
(target conversations labelled per turn by the rules detectors). `moe.test_rollouts` (the agent's own held-out
target conversations) are labelled per turn by the same rule.
"""

from __future__ import annotations

import sys
from typing import Any

from trace_cli.compose.moe_train import Transcript, stratum

NEEDS = "needs"  # moe.data's expert for target transcripts labelled with what each one needs


def has_episodes(adapter_art) -> bool:
    from trace_cli.store import layout

    return (adapter_art.path / layout.EPISODES).is_file()


def _of(ep: dict[str, Any], key: str, slot: int, labels: list[int] | None = None) -> Transcript:
    s = stratum(labels) if labels is not None else slot
    return Transcript(s, ep["messages"], ep.get("tools") or [], key, labels)


def by_need_per_turn(eps: list[dict[str, Any]], names: list[str], prefix: str) -> list[Transcript]:
    """Target conversations labelled per turn by the rules detectors (`compose.needs`)."""
    from trace_cli.compose.needs import by_need, turn_labels

    return [
        _of(ep, f"{prefix}:{ep.get('episode_id', i)}", s, turn_labels(ep, s, names))
        for i, (ep, s) in enumerate(zip(eps, by_need(eps, names), strict=True))
    ]


def from_data(data: list[dict[str, Any]], slots: dict[str, int], names: list[str]) -> list[Transcript]:
    """moe.data entries: an expert's or base's rollouts (one slot throughout), or 'needs' (per turn)."""
    from trace_cli.store.rollouts import read_episodes

    out = []
    for d in data:
        only_ok = d.get("success_only", d["expert"] not in ("base", NEEDS))
        eps = [ep for ep in read_episodes(d["art"].path) if ep.get("success") or not only_ok]
        if d["expert"] == NEEDS:
            out += by_need_per_turn(eps, names, d["art"].id)
            continue
        out += [_of(ep, f"{d['art'].id}:{i}", slots[d["expert"]]) for i, ep in enumerate(eps)]
    return out


def from_diagnosis(diag, rollouts, names: list[str]) -> list[Transcript]:
    """The diagnosed conversations: the expert from the diagnosis's labels, per turn from where it shows."""
    from trace_cli.compose.needs import diagnosed, turn_labels

    return [
        _of(ep, f"{rollouts.id}:{ep['episode_id']}", s, turn_labels(ep, s, names))
        for ep, s in diagnosed(diag, rollouts, names)
    ]


def from_training(adapter_art, slot: int) -> list[Transcript]:
    """An expert's own training episodes with a positive advantage in their group, every turn its slot."""
    from trace_cli.store.rollouts import read_episodes

    return [
        _of(ep, f"{adapter_art.id}:{ep['episode_id']}", slot)
        for ep in read_episodes(adapter_art.path)
        if float((ep.get("info") or {}).get("advantage", 0.0)) > 0
    ]


def generated(policy, store, jobs, max_turns: int, envs, names: list[str]) -> list[Transcript]:
    """Rollouts of `policy` on (slot, env): the target's (slot 0) labelled per turn by need, an expert
    environment's successes with its slot."""
    from trace_cli.compose.needs import as_episode
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout

    out = []
    for s, env in envs:
        results = rollout(policy, lambda env=env: make_env(env, store=store), jobs, max_turns=max_turns)
        if s == 0:
            eps = [dict(as_episode(r), tools=r.tools, episode_id=str(r.seed)) for r in results]
            out += by_need_per_turn(eps, names, "0")
            continue
        out += [Transcript(s, r.messages, r.tools, f"{s}:{r.seed}") for r in results if r.success]
    return out


ROUTING_KEYS = (
    "transcripts",
    "generated_episodes",
    "train_episodes",
    "held_out_episodes",
    "routing_accuracy",
)


def routing_report(summary: dict[str, Any]) -> dict[str, Any]:
    """The composition's `moe` section (printed too): routing accuracy per held-out turn, per slot."""
    rep = {k: v for k, v in summary.items() if k in ROUTING_KEYS or k.startswith("routing_")}
    convs = rep.get("routing_test_conversations_per_expert") or rep.get("routing_test_episodes") or {}
    for n, acc in (rep.get("routing_accuracy_per_expert") or {}).items():
        print(
            f"moe routing: {n:<28} turn accuracy {acc}  turns {rep['routing_turns_per_expert'][n]:>5}  "
            f"held-out conversations {convs.get(n)}",
            file=sys.stderr,
        )
    return rep
