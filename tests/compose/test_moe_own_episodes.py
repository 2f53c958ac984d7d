"""compose moe without moe.data: the gates learn from the adapters' own training episodes (positive advantage,
every turn the expert's) and the base's diagnosed target conversations (labelled per turn), and no rollout is
generated; routing accuracy per held-out turn is in the composition's `moe` section with its conversations."""

from __future__ import annotations

import json

import pytest
from compose_helpers import CAPS, make_adapter

from trace_cli.stages.base import execute

NEED_TARGET = "shop?families=return_item,exchange,order_status"
DEFICIENT = "policy:demonstration?deficits=structured_data_reasoning,tool_calling_precision&rate=1"


def _training_episodes(store, env: str, name: str) -> list[dict]:
    """Episodes as a GRPO run keeps them: reference rollouts on the expert's environment, half of each group of
    two above its mean (advantage +0.5) and half below (-0.5)."""
    from trace_cli.store.rollouts import read_episodes

    ro = execute("eval", {"model": "policy:reference", "env": env, "seeds": "0:40"}, store, name=name)
    eps = read_episodes(ro.outputs["rollouts"].path)
    for i, ep in enumerate(eps):
        ep["info"] = json.dumps({"step": 1, "advantage": 0.5 if i % 2 == 0 else -0.5, "group_mean": 0.5})
        ep["messages"], ep["tools"] = json.dumps(ep["messages"]), json.dumps(ep["tools"])
        ep["reference_actions"] = json.dumps(ep["reference_actions"])
    return eps


@pytest.fixture(scope="module")
def own_store(tiny, tmp_path_factory):
    from compose_helpers import register_envs

    from trace_cli.store import Store

    register_envs()
    st = Store(tmp_path_factory.mktemp("own") / "store")
    for i, (cap, env) in enumerate(CAPS.items()):
        eps = _training_episodes(st, env, f"ref-{i}")
        make_adapter(st, tiny.hf, cap, env, seed=i + 1, name=f"own{i}", episodes=eps)
    ro = execute("eval", {"model": DEFICIENT, "env": NEED_TARGET, "seeds": "200:260"}, st, name="base-target")
    execute("diagnose", {"rollouts": ro.outputs["rollouts"].uri, "analyst": "rules"}, st, name="diag")
    return st


def test_compose_uses_the_adapters_episodes_and_generates_nothing(own_store, monkeypatch):
    import trace_cli.envs.rollout as rollout_mod
    from trace_cli.compose.spec import read_composition

    def no_rollouts(*a, **k):
        raise AssertionError("compose generated rollouts")

    monkeypatch.setattr(rollout_mod, "rollout", no_rollouts)
    moe = {"target": NEED_TARGET, "diagnosis": "store://diagnosis/diag", "steps": 60, "held_out_min": 4}
    cfg = {"method": "moe", "adapters": ["store://adapter/own0", "store://adapter/own1"], "moe": moe}
    art = execute("compose", cfg, own_store, name="own-moe").main
    s = art.summary
    assert s["generated_episodes"] == 0
    # each expert: its 20 positive-advantage episodes of 40, plus the diagnosed conversations lacking it
    sdr, tcp = CAPS
    assert s["transcripts"][sdr] >= 20 and s["transcripts"][tcp] >= 20, s["transcripts"]
    assert s["transcripts"]["base"] >= 20, s["transcripts"]
    doc = read_composition(art.path)
    rep = doc["moe"]
    assert rep["routing_accuracy"] == s["routing_accuracy"] is not None
    per = rep["routing_test_conversations_per_expert"]
    assert all(per[n] >= 4 for n in ("base", sdr, tcp)), per
    assert sum(rep["routing_turns_per_expert"].values()) == rep["routing_turns"] > 0
