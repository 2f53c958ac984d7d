"""Tool schemas recovered from rollouts (τ²-bench retail), and templates built on them: equal schemas, fallbacks."""

from __future__ import annotations

import pytest
from trace_testing import TAU2_FILES

from trace_cli.envs.scripted import replay
from trace_cli.envs.shop import TOOL_SCHEMAS
from trace_cli.envs.synthetic import TEMPLATES, make_template, recover_tools
from trace_cli.stages.base import execute
from trace_cli.store import Store

TAU2_RETAIL = {
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "get_product_details",
    "cancel_pending_order",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "modify_user_address",
    "modify_pending_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "transfer_to_human_agents",
    "calculate",
    "list_all_product_types",
}


@pytest.fixture(scope="module")
def retail(tau2_dir, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("recover") / "store")
    art = execute("ingest", {"format": "tau2", "path": str(tau2_dir / TAU2_FILES["retail"])}, store).main
    return art, recover_tools(art)


def test_recovered_names_types_and_required(retail):
    _, tools = retail
    assert set(tools) == TAU2_RETAIL
    addr = tools["modify_user_address"]["function"]["parameters"]
    assert addr["required"] == ["address1", "address2", "city", "country", "state", "user_id", "zip"]
    assert all(p == {"type": "string"} for p in addr["properties"].values())
    ret = tools["return_delivered_order_items"]["function"]["parameters"]
    assert ret["properties"]["item_ids"] == {"type": "array", "items": {"type": "string"}}
    assert tools["get_order_details"]["function"]["parameters"]["properties"] == {
        "order_id": {"type": "string"}
    }


def test_required_is_always_present_and_types_union():
    eps = [
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "1", "function": {"name": "f", "arguments": {"a": 1, "b": "x"}}},
                        {"id": "2", "function": {"name": "f", "arguments": '{"a": 2.5}'}},
                        {"id": "3", "requestor": "user", "function": {"name": "user_tool", "arguments": {}}},
                    ],
                }
            ]
        }
    ]
    f = recover_tools(eps)["f"]["function"]["parameters"]
    assert f["required"] == ["a"] and f["properties"] == {"a": {"type": "number"}, "b": {"type": "string"}}
    assert "user_tool" not in recover_tools(eps)
    declared = [{"tools": [TOOL_SCHEMAS["get_order_details"]], "messages": []}]
    assert recover_tools(declared) == {"get_order_details": TOOL_SCHEMAS["get_order_details"]}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_use_the_targets_schemas_exactly(retail, name):
    _, tools = retail
    env = make_template(name, tools=tools)
    obs = env.reset(1)
    for t in obs.tools:
        n = t["function"]["name"]
        if n in tools:
            assert env.tool_sources[n] == "target"
            assert (t["function"]["name"], t["function"]["parameters"]) == (
                tools[n]["function"]["name"],
                tools[n]["function"]["parameters"],
            )
        else:  # τ² retail has no list_user_orders: the shop schema stands in, and that is recorded
            assert env.tool_sources[n] == "shop_fallback" and t == TOOL_SCHEMAS[n]
    assert ("list_user_orders" in env.TOOLS) == ("shop_fallback" in env.tool_sources.values())
    for seed in range(40):  # the looser recovered schemas still admit the reference solution
        env.reset(seed)
        assert replay(env, seed, env.reference_actions()).verdict.success


def test_loose_schema_extra_argument_is_an_error_not_a_crash(retail):
    _, tools = retail
    env = make_template("precondition_verification", tools=tools)
    env.reset(0)
    r = env.step({"name": "get_order_details", "arguments": {"order_id": "#W1", "extra": 1}})
    assert r.error and "extra" in r.observation
