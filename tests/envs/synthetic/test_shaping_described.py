"""How the diagnosed conversations' users described the items they returned (`return_described`), and the
structured_data_reasoning template posing those kinds: shop-ladder's planted lookup ("return the T-Shirt from
order #W1") pins its `by_name` kind, which no level poses (issue 44)."""

from __future__ import annotations

from collections import Counter

from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import replay
from trace_cli.envs.synthetic import TEMPLATES
from trace_cli.envs.synthetic.shaping import profile, shape_for
from trace_cli.envs.synthetic.structured_data_reasoning import KINDS

SD = TEMPLATES["structured_data_reasoning"]


def _episodes(env_ref: str, n: int) -> list[dict]:
    env, out = make_env(env_ref), []
    for seed in range(n):
        env.reset(seed)
        ref = env.reference_actions()
        ep = replay(make_env(env_ref), seed, ref)
        out.append({"reference_actions": ref, "messages": ep.messages, "meta": env.task_metadata()})
    return out


def test_return_descriptions_are_read_from_the_users_messages():
    shop = _episodes("shop?families=return_item", 45)
    assert profile(shop)["return_described"] == dict(
        sorted(Counter(e["meta"]["variant"] for e in shop).items())
    )
    ladder = _episodes("shop-ladder", 27)
    lookups = sum("lookup" in e["meta"]["skills"] for e in ladder)
    assert lookups > 0 and profile(ladder)["return_described"] == {"by_name": lookups}
    # no messages (an import without them), or no return: nothing described
    assert profile([{"reference_actions": e["reference_actions"]} for e in shop])["return_described"] == {}
    statuses = [e for e in _episodes("shop?families=order_status", 6)]
    assert profile(statuses)["return_described"] == {}


def test_the_template_poses_the_described_kinds_and_by_name_only_when_pinned():
    pins = SD.shape(profile(_episodes("shop-ladder", 27)))
    assert pins["kinds"] == ["by_name"]
    s = shape_for(SD, _episodes("shop-ladder", 27), 5, {})
    assert s["params"]["kinds"] == ["by_name"]
    assert all("by_name" not in (lvl["kinds"]) for lvl in SD.LEVELS) and "by_name" not in KINDS
    env = SD(level=0, **pins)
    for seed in range(12):
        obs = env.reset(seed)
        meta = env.task_metadata()
        assert meta["variant"] == "by_name"
        item = next(a for a in env.reference_actions() if a.get("name") == "return_delivered_order_items")
        asked = obs.messages[0]["content"]
        assert item["arguments"]["item_ids"][0] not in asked  # the id is only in the order's details
        ep = replay(SD(level=0, **pins), seed, env.reference_actions())
        assert ep.reward == 1.0
    # shop-mixed's returns pin what its users asked for (most expensive first), never by_name
    mixed = SD.shape(profile(_episodes("shop-mixed", 80)))
    assert "most_expensive" in mixed["kinds"] and "by_name" not in mixed["kinds"]
