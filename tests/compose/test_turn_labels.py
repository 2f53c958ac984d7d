"""Per-turn labels of the MoE gates (`compose.needs`, `compose.moe_data`, `compose.moe_train`): a target
conversation is base up to the turn where the rules detector locates the capability it lacks and that expert from
it on; an expert's own training episodes teach its slot when their advantage is positive; every token carries
the label of the assistant turn it leads to."""

from __future__ import annotations

import json
from types import SimpleNamespace

from trace_cli.compose.moe_data import from_training
from trace_cli.compose.moe_train import Example, Transcript, split
from trace_cli.compose.needs import problem_turn, turn_labels

NAMES = ["multi_step_completion", "precondition_verification"]  # slots 1, 2


def _call(i: int, name: str, **args) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}


def _conversation(read_first: bool) -> dict:
    """Cancel order #W2: turn 0 reads #W1 (the wrong one), turn 1 cancels #W2 (read first or not), turn 2 says so."""
    msgs = [
        {"role": "system", "content": "You are a shop agent."},
        {"role": "user", "content": "Please cancel my order #W2."},
        {"role": "assistant", "content": "", "tool_calls": [_call(0, "get_order_details", order_id="#W1")]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"order_id": "#W1", "status": "pending"}'},
    ]
    if read_first:
        msgs[2]["tool_calls"][0]["function"]["arguments"] = {"order_id": "#W2"}
        msgs[3]["content"] = '{"order_id": "#W2", "status": "pending"}'
    msgs += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call(1, "cancel_pending_order", order_id="#W2")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "cancelled"}'},
        {"role": "assistant", "content": "Your order #W2 is cancelled."},
    ]
    ref = [
        {"name": "get_order_details", "arguments": {"order_id": "#W2"}},
        {"name": "cancel_pending_order", "arguments": {"order_id": "#W2"}},
    ]
    return {
        "episode_id": f"e-{read_first}",
        "task_id": "t",
        "success": read_first,
        "reward": float(read_first),
        "messages": msgs,
        "tools": [],
        "reference_actions": ref,
    }


def test_a_conversation_is_base_until_the_turn_where_its_problem_shows():
    ep = _conversation(read_first=False)
    assert problem_turn(ep, "precondition_verification") == 1  # the cancel without reading #W2
    assert turn_labels(ep, 2, NAMES) == [0, 2, 2]


def test_a_conversation_lacking_none_is_base_throughout_and_an_unlocated_problem_is_the_experts_throughout():
    ok = _conversation(read_first=True)
    assert problem_turn(ok, "precondition_verification") is None
    assert turn_labels(ok, 0, NAMES) == [0, 0, 0]
    # a diagnosis (say an LLM's) calls it lacking multi-step, which the detector never sees: every turn
    assert problem_turn(ok, "multi_step_completion") is None
    assert turn_labels(ok, 1, NAMES) == [1, 1, 1]


def test_an_experts_training_episodes_with_positive_advantage_teach_its_slot(tmp_path):
    from trace_cli.store.rollouts import write_tables

    rows = []
    for i, adv in enumerate([0.5, -0.5, 0.0, 0.25]):
        ep = _conversation(read_first=True)
        rows.append(
            {
                "episode_id": f"e{i}",
                "reward": 0.5 + adv,
                "success": adv > 0,
                "messages": json.dumps(ep["messages"]),
                "tools": "[]",
                "info": json.dumps({"step": 1, "advantage": adv, "group_mean": 0.5}),
            }
        )
    write_tables(tmp_path, rows, [])
    got = from_training(SimpleNamespace(path=tmp_path, id="ad"), 2)
    assert [t.key for t in got] == ["ad:e0", "ad:e3"]
    assert all(t.turn_labels() == [2, 2, 2] for t in got)


def test_every_token_carries_the_label_of_the_turn_it_leads_to():
    e = Example(slot=2, ids=list(range(20)), first=2, turns=[(4, 7), (10, 13), (15, 18)], labels=[0, 2, 1])
    assert e.token_labels() == [0] * 5 + [2] * 6 + [1] * 7  # tokens 2..6, 7..12, 13..19
    per_conversation = Example(slot=2, ids=list(range(6)), first=1)
    assert per_conversation.token_labels() == [2] * 5


def test_the_split_holds_out_whole_conversations_and_at_least_the_minimum():
    ex = [Example(slot=i % 2, ids=[1, 2], first=1, key=f"k{i // 2}" if i < 4 else f"k{i}") for i in range(40)]
    train, test = split(ex, 0.1, seed=0, at_least=8)
    assert not {e.key for e in train} & {e.key for e in test}
    assert sum(1 for e in test if e.slot == 0) >= 8 and sum(1 for e in test if e.slot == 1) >= 8
    t = Transcript(0, [{"role": "assistant"}] * 2, [], "k")
    assert t.turn_labels() == [0, 0]


def _two_part(i: int) -> Transcript:
    """A conversation whose first assistant turn is base's and whose second is the expert's (slot 1)."""
    msgs = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": f"order {i}"},
        {"role": "assistant", "content": "hello hello hello hello hello hello"},
        {"role": "user", "content": "and then"},
        {"role": "assistant", "content": "cancel cancel cancel cancel cancel cancel"},
    ]
    return Transcript(1, msgs, [], f"c{i}", [0, 1])


def test_gates_learn_per_turn_labels(composed_store, tiny):
    """Trained on per-turn labels, the gates route each held-out turn to its own slot: base for the first, the
    expert for the second. Trained on one label per conversation (its slot on every turn) they would not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.compose.adapters import check_targets, load_lora
    from trace_cli.compose.moe import attach
    from trace_cli.compose.moe_train import build_examples, routing_accuracy, train_gates

    tok = AutoTokenizer.from_pretrained(tiny.hf)
    model = AutoModelForCausalLM.from_pretrained(tiny.hf, dtype=torch.float32)
    art = composed_store.resolve("store://adapter/structured", kind="adapter")
    loras = [load_lora(art.path / "adapter", "structured_data_reasoning")]
    layers, trace = attach(model, loras, check_targets(model, loras), context=False, pad_id=tok.pad_token_id)
    ex = build_examples(tok, [_two_part(i) for i in range(24)], 256)
    assert all(e.labels == [0, 1] for e in ex)
    train, test = ex[:16], ex[16:]
    pad = tok.pad_token_id or 0
    train_gates(
        model,
        layers,
        trace,
        train,
        n_slots=2,
        steps=40,
        lr=0.05,
        batch_size=8,
        aux_coef=0.0,
        seed=0,
        pad_id=pad,
    )
    got = routing_accuracy(model, trace, test, n_slots=2, names=["base", "x"], pad_id=pad)
    assert got["routing_turns_per_expert"] == {"base": 8, "x": 8}
    assert got["routing_test_conversations_per_expert"] == {"base": 8, "x": 8}
    assert got["routing_accuracy_per_expert"]["base"] >= 0.9, got
    assert got["routing_accuracy_per_expert"]["x"] >= 0.9, got
