"""Environments shaped by the diagnosis: the task-mix profile of conversations (from their reference actions) and
each template's pins from it."""

from __future__ import annotations

from collections import Counter

import pytest

from trace_cli.envs.registry import make_env
from trace_cli.envs.shop.tools import WRITE_TOOLS
from trace_cli.envs.synthetic import TEMPLATES
from trace_cli.envs.synthetic.shaping import profile, shape_for


def _ep(*actions):
    return {"reference_actions": list(actions)}


def _call(name, **args):
    return {"name": name, "arguments": args}


READ = _call("get_order_details", order_id="#W1")
REFUSE = {"content": "Sorry, order #W1 is delivered. Only pending orders can be cancelled."}


def test_profile_counts_writes_refusals_lookups_and_gift_cards():
    eps = [
        _ep(READ, REFUSE),  # a refused cancel
        _ep(READ, _call("cancel_pending_order", order_id="#W1", reason="no longer needed")),
        _ep(
            _call("return_delivered_order_items", order_id="#W2", payment_method_id="gift_card_1"),
            _call("return_delivered_order_items", order_id="#W3", payment_method_id="credit_card_2"),
            _call("modify_user_address", user_id="u", zip="01234"),
        ),
        {"reference_actions": None},  # imported without reference actions: not counted
    ]
    p = profile(eps)
    assert p["tasks"] == 3 and p["kinds"] == {"address": 1, "cancel": 1, "return": 2}
    assert p["refused"] == 1 and p["writes_per_task"] == [0, 1, 3]
    assert p["order_requests_per_task"] == [1, 1, 2]
    assert p["lookup_before_write"] == round(1 / 3, 3) and p["gift_card_share"] == 0.5


def test_profile_of_real_shop_mixed_tasks_matches_their_writes():
    env = make_env("shop-mixed")
    eps = []
    for s in range(200):
        env.reset(s)
        eps.append({"reference_actions": env.reference_actions(), "family": env.task_metadata()["family"]})
    p = profile(eps)
    writes = Counter(a["name"] for e in eps for a in e["reference_actions"] if a.get("name") in WRITE_TOOLS)
    assert sum(p["kinds"].values()) == sum(writes.values()) > 0
    assert p["kinds"]["cancel"] == writes["cancel_pending_order"]
    # every cancel_order task without a write is a refusal the profile counts
    refused_cancels = sum(
        1
        for e in eps
        if e["family"] == "cancel_order"
        and not any("name" in a and a["name"] in WRITE_TOOLS for a in e["reference_actions"])
    )
    assert refused_cancels > 0 and p["refused"] >= refused_cancels


def test_templates_pin_the_mix_and_leave_difficulty_to_the_levels():
    p = profile(
        [_ep(READ, REFUSE), _ep(READ, REFUSE), _ep(READ, _call("cancel_pending_order", order_id="#W1"))]
    )
    pv = TEMPLATES["precondition_verification"].shape(p)
    assert pv == {"forbidden_fraction": 0.67, "return_fraction": 0.0}
    ms = TEMPLATES["multi_step_completion"].shape(
        profile([_ep(_call("cancel_pending_order"), _call("return_delivered_order_items"))])
    )
    assert ms == {"ops": ["cancel", "return"]}
    # an address change alone cannot make a multi-operation task: no pin
    assert TEMPLATES["multi_step_completion"].shape(profile([_ep(_call("modify_user_address"))])) == {}
    tp = TEMPLATES["tool_calling_precision"].shape(profile([_ep(_call("exchange_delivered_order_items"))]))
    assert tp == {"kinds": ["exchange"]}
    sd = TEMPLATES["structured_data_reasoning"].shape(
        profile([_ep(_call("return_delivered_order_items", payment_method_id="gift_card_9"))])
    )
    assert sd == {"gift_card_fraction": 0.95}  # kept inside [0.05, 0.95]: both kinds stay in training
    assert TEMPLATES["structured_data_reasoning"].shape(profile([_ep(READ, REFUSE)])) == {}


def test_shape_for_keeps_given_params_and_needs_enough_conversations(capfd):
    cls = TEMPLATES["precondition_verification"]
    eps = [_ep(READ, REFUSE)] * 4 + [_ep(READ, _call("return_delivered_order_items"))]
    s = shape_for(cls, eps, 5, {"forbidden_fraction": 0.3})
    assert s["params"] == {"return_fraction": 0.2} and s["lacking_conversations"] == 5
    assert shape_for(cls, eps, 6, {})["params"] == {}  # 5 conversations < min_tasks 6
    assert "fewer than shape_min_tasks 6" in capfd.readouterr().err  # said, not silent
    # pins the template refuses with the given params are dropped, and said
    ms = TEMPLATES["multi_step_completion"]
    two = [_ep(_call("cancel_pending_order"), _call("modify_user_address"))] * 5
    s = shape_for(ms, two, 5, {"max_ops": 5, "n_orders": 3})
    assert s["params"] == {} and "max_ops" in s["refused"]
    assert "not shaping multi_step_completion" in capfd.readouterr().err


@pytest.mark.parametrize("cap", sorted(TEMPLATES))
def test_every_template_accepts_its_own_pins_at_every_level(cap):
    """The pins from the target's whole task mix are valid at each level calibration may move to."""
    env = make_env("shop-mixed")
    eps = []
    for s in range(300):
        env.reset(s)
        eps.append({"reference_actions": env.reference_actions()})
    cls = TEMPLATES[cap]
    pins = cls.shape(profile(eps))
    for level in range(len(cls.LEVELS)):
        cls(level=level, **pins)
