"""Stage `compose` and `trace compose`: router and merge build from adapter artifacts and evaluate on shop;
the router's decisions (top-1 / top-p / base, re-routing per user turn) and its weight merge match PEFT; bad
input exits 2 with nothing written (one adapter, unknown adapter, different bases, gates from another base)."""

# ruff: noqa: F811  (pytest fixtures imported from compose_helpers)
from __future__ import annotations

import pytest
import torch
import yaml
from compose_helpers import (  # noqa: E402, F401
    CAPS,
    TARGET,
    composed_store,  # noqa: E402, F401
    make_adapter,
    tiny,
)
from trace_testing import run_cli, short_eval, snapshot  # noqa: E402

from trace_cli.stages.base import execute  # noqa: E402

ADAPTERS = ["--adapter", "store://adapter/structured", "--adapter", "store://adapter/tool"]


@pytest.mark.parametrize("method", ["router", "merge"])
def test_build_and_eval_on_shop(composed_store, tiny, method):
    st = composed_store
    r = run_cli(
        "compose",
        "--method",
        method,
        "--base",
        tiny.hf,
        *ADAPTERS,
        "--name",
        f"t-{method}",
        "--store",
        st.root,
    )
    assert r.exit_code == 0, r.output
    art = st.resolve(f"store://composition/t-{method}")
    doc = yaml.safe_load((art.path / "composition.yaml").read_text())
    assert doc["method"] == method and [e["name"] for e in doc["experts"]] == list(CAPS)
    assert (
        "right value from structured tool output" in doc["experts"][0]["description"]
    )  # the capability's catalogue text
    assert doc["base"]["digest"] == art.manifest["inputs"][0]["digest"]
    if method == "merge":
        assert (art.path / "merged" / "adapter_model.safetensors").is_file()
    else:
        assert [e["label"] for e in doc["experts"]] == ["B", "C"] and doc["settings"]["router"][
            "top_p"
        ] == 0.8
    r = short_eval(f"store://composition/t-{method}", st.root, "--json")
    assert r.exit_code == 0, r.output
    again = run_cli("compose", "--method", method, *ADAPTERS, "--store", st.root)  # base inferred: same id
    assert again.exit_code == 0 and "up to date" in again.output


@pytest.mark.parametrize("method", ["router", "moe"])
def test_one_adapter_composes_with_the_base_as_a_slot(composed_store, tiny, method):
    """Router and moe take a single adapter: the base is always a slot (router label A, moe slot 0), so the
    composition can keep the base where the adapter does not apply."""
    st = composed_store
    cfg = {"method": method, "base": str(tiny.hf), "adapters": ["store://adapter/structured"]}
    if method == "moe":
        cfg["moe"] = {"data": [], "seeds": "0:3", "steps": 0, "target": TARGET}
    art = execute("compose", cfg, st, name=f"one-{method}").main
    doc = yaml.safe_load((art.path / "composition.yaml").read_text())
    assert [e["name"] for e in doc["experts"]] == [list(CAPS)[0]] and art.summary["n_experts"] == 1
    if method == "router":
        assert doc["experts"][0]["label"] == "B"  # A is the base
    else:
        assert doc["experts"][0]["slot"] == 1 and doc["gates"]["slots"] == ["base", list(CAPS)[0]]
    ev = {"model": art.uri, "env": "shop", "seeds": "0:2", "max_turns": 2, "max_new_tokens": 6}
    assert execute("eval", ev, st).outputs["eval"].summary["episodes"] == 2


def test_router_decisions():
    from trace_cli.compose.router import decide

    assert decide([0.5, 0.3, 0.2], "top_p", 0.8) == {}  # base wins: no adapter
    assert decide([0.1, 0.6, 0.3], "top1", 0.8) == {1: 1.0}
    mix = decide([0.1, 0.6, 0.3], "top_p", 0.8)  # 0.6 + 0.3 >= 0.8, renormalised
    assert set(mix) == {1, 2} and abs(mix[1] - 0.6 / 0.9) < 1e-9
    mix = decide([0.25, 0.6, 0.15], "top_p", 0.8)  # base survives top-p: its share adds nothing
    assert set(mix) == {1} and abs(mix[1] - 0.6 / 0.85) < 1e-9


def test_weight_merge_equals_peft_and_restores(composed_store, tiny):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trace_cli.compose.adapters import check_targets, load_lora
    from trace_cli.compose.router import WeightMerger

    art = composed_store.resolve("store://adapter/structured")
    x = torch.tensor([[5, 9, 13, 40, 77]])
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.hf), art.path / "adapter")
    with torch.no_grad():
        want = ref(x).logits
    model = AutoModelForCausalLM.from_pretrained(tiny.hf)
    with torch.no_grad():
        before = model(x).logits
    lora = load_lora(art.path / "adapter", "s")
    merger = WeightMerger(model, [lora], check_targets(model, [lora]))
    merger.apply({1: 1.0})
    with torch.no_grad():
        assert torch.allclose(model(x).logits, want, atol=1e-4)
        merger.apply({})
        # exact: the base weights restored (not recomputed), the same forward on them
        assert torch.equal(model(x).logits, before)


def test_router_policy_routes_per_conversation_or_user_turn(composed_store, tiny):
    from trace_cli.compose.policy import load_composition_policy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout

    art = execute("compose", {"method": "router", "adapters": ["structured", "tool"]}, composed_store).main
    pol = load_composition_policy(art.path, tiny.hf, temperature=0.0, max_new_tokens=4)
    rollout(pol, lambda: make_env("shop"), [(0, 0), (1, 0)], max_turns=3)
    assert len(pol.decisions) == 2  # once per conversation
    d = pol.decisions[0]
    assert set(d["probs"]) == {"base", *CAPS} and abs(sum(d["probs"].values()) - 1) < 1e-3
    art2 = execute(
        "compose",
        {"method": "router", "adapters": ["structured", "tool"], "router": {"reroute": "user_turn"}},
        composed_store,
    ).main
    pol2 = load_composition_policy(art2.path, tiny.hf, temperature=0.0, max_new_tokens=4)
    from trace_cli.envs.rollout import start

    st = start(make_env("shop"), 0)
    pol2.act([st])
    pol2.act([st])  # no new user message: the decision stands
    assert len(pol2.decisions) == 1
    st.messages += [
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Also exchange it."},
    ]
    pol2.act([st])  # a new user turn is routed again
    assert len(pol2.decisions) == 2 and len(st.compose_route["decisions"]) == 2


def _fails(st, *args) -> str:
    before = snapshot(st.root)
    r = run_cli("compose", *args, "--store", st.root)
    assert r.exit_code == 2, r.output
    assert snapshot(st.root) == before, "nothing may be written on a usage error"
    return r.output


def test_bad_input_exit_2(composed_store, tiny, tmp_path):
    st = composed_store
    out = _fails(st, "--method", "merge", "--adapter", "store://adapter/structured")
    assert "a merge needs at least two adapters" in out
    out = _fails(
        st,
        "--method",
        "router",
        "--adapter",
        "store://adapter/structured",
        "--adapter",
        "store://adapter/nope",
    )
    assert "no adapter artifact named or with id 'nope'" in out
    # an adapter on another base model (a copy of the tiny model with other weights)
    import tinymodel

    other = tinymodel.noisy_copy(tiny, tmp_path / "other", seed=3)
    make_adapter(st, other, "multi_step_completion", "shop", seed=9, name="other-base")
    out = _fails(
        st, "--method", "merge", "--adapter", "structured", "--adapter", "store://adapter/other-base"
    )
    assert "adapters on different base models" in out
    out = _fails(st, "--method", "router", "--base", str(other), *ADAPTERS)
    assert "trained on another base model" in out
    # gates from another base: an moe composition (untrained gates) on the other base, reused here
    make_adapter(st, other, "tool_calling_precision", "shop", seed=10, name="other-base2")
    g = execute(
        "compose",
        {
            "method": "moe",
            "adapters": ["store://adapter/other-base", "store://adapter/other-base2"],
            "moe": {"data": [], "seeds": "0:3", "steps": 0, "target": TARGET},
        },
        st,
        name="other-moe",
    )
    assert g.main.summary["steps"] == 0
    out = _fails(st, "--method", "moe", *ADAPTERS, "--set", "moe.gates=store://composition/other-moe")
    assert "trained on another base model" in out and "gates" in out
    out = _fails(st, "--method", "moe", *ADAPTERS, "--data", "nobody=store://rollouts/x")
    assert "'nobody' is not 'base', 'needs' or one of" in out
    out = _fails(st, "--method", "router", *ADAPTERS, "--set", "merge.weights=[1]")
    assert "only used by method merge" in out
