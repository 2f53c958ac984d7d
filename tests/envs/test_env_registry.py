"""Registry: reference parsing, parameter errors, register(), store hook and real entry-point discovery."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from echo_env import EchoEnv

from trace_cli.envs import registry
from trace_cli.envs.base import Environment
from trace_cli.envs.registry import list_envs, make_env, parse_env_ref, register
from trace_cli.envs.shop import ShopEnv
from trace_cli.errors import NotFoundError, UsageError


def test_builtin_shop_is_listed_and_built():
    assert "shop" in list_envs()
    env = make_env("shop")
    assert isinstance(env, ShopEnv) and isinstance(env, Environment)
    assert env.max_turns == 12


def test_query_and_dict_references():
    env = make_env("shop?families=cancel_order,multi_op&n_orders=6&max_turns=9")
    assert env.families == ["cancel_order", "multi_op"] and env.n_orders == 6 and env.max_turns == 9
    env = make_env({"name": "shop", "params": {"families": ["exchange"], "n_orders": 4}})
    assert env.families == ["exchange"] and env.n_orders == 4
    # a single family in a query string arrives as text, not a list
    assert make_env("shop?families=order_status").families == ["order_status"]
    # keyword params override the reference's
    assert make_env("shop?n_orders=6", n_orders=7).n_orders == 7


def test_parse_env_ref_values():
    name, params = parse_env_ref("x.y-z?a=1&b=1.5&c=true&d=p,q&e=007&f=text")
    assert name == "x.y-z"
    assert params == {"a": 1, "b": 1.5, "c": True, "d": ["p", "q"], "e": "007", "f": "text"}


def test_unknown_environment_lists_known_names():
    with pytest.raises(NotFoundError) as err:
        make_env("nope")
    assert "nope" in str(err.value) and "shop" in str(err.value)


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("shop?bogus=1", "bogus"),
        ("shop?n_orders=abc", "n_orders"),
        ("shop?n_orders=99", "n_orders"),
        ("shop?max_turns=0", "max_turns"),
        ("shop?families=nope", "families"),
        ("shop?tool_set=some", "tool_set"),
        ("shop?a=1&a=2", "'a'"),
        ({"name": "shop", "params": {"families": []}}, "families"),
        ({"name": "shop", "extra": 1}, "extra"),
        ({"name": "shop", "params": [1]}, "params"),
        ("bad name!", "invalid environment name"),
        (42, "string or a mapping"),
    ],
)
def test_bad_references_and_params_are_usage_errors(ref, needle):
    with pytest.raises(UsageError) as err:
        make_env(ref)
    assert needle in str(err.value)
    assert not isinstance(err.value, NotFoundError)


def test_store_references_need_a_store():
    with pytest.raises(UsageError, match="needs a store"):
        make_env("store://environment/abc")
    with pytest.raises(NotFoundError, match="store://environment/abc"):
        make_env("store://environment/abc", store=object())


def test_register_checks_names_duplicates_and_params():
    register("tiny-test", EchoEnv)
    try:
        with pytest.raises(UsageError, match="already registered"):
            register("tiny-test", EchoEnv)
        register("tiny-test", EchoEnv, overwrite=True)
        assert "tiny-test" in list_envs()
        env = make_env("tiny-test?word=hello")
        assert env.word == "hello"
        with pytest.raises(UsageError, match="'colour'"):
            make_env("tiny-test", colour="red")
    finally:
        registry.unregister("tiny-test")
    assert "tiny-test" not in list_envs()
    with pytest.raises(UsageError, match="invalid environment name"):
        register("9lives", EchoEnv)
    with pytest.raises(UsageError, match="not callable"):
        register("thing", 3)


def test_factory_returning_a_non_environment_is_rejected():
    register("not-an-env", lambda: object())
    try:
        with pytest.raises(UsageError, match="does not implement"):
            make_env("not-an-env")
    finally:
        registry.unregister("not-an-env")


# the third-party package the discovery test installs (a copy of echo_env.py under its own name)
PLUGIN = (Path(__file__).parent / "echo_env.py").read_text()


def test_entry_point_discovery(tmp_path, monkeypatch):
    """A dist-info with entry_points.txt on sys.path is found by importlib.metadata: real plugin discovery."""
    (tmp_path / "echo_env_plugin.py").write_text(PLUGIN)
    info = tmp_path / "echo_env_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-env-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [trace_cli.environments]
            echo = echo_env_plugin:make_echo
            echo-missing = echo_env_plugin_gone:make_echo
            """
        )
    )
    assert "echo" not in list_envs()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert {"echo", "echo-missing", "shop"} <= set(list_envs())
        env = make_env("echo?word=pong")
        obs = env.reset(0)
        assert obs.messages[0]["content"] == "pong"
        result = env.step({"content": "pong"})
        assert result.done and env.verify().success
        with pytest.raises(UsageError, match="failed to load"):
            make_env("echo-missing")
    finally:
        monkeypatch.undo()
        sys.modules.pop("echo_env_plugin", None)
    with pytest.raises(NotFoundError):
        make_env("echo")


def test_any_registered_target_takes_a_hint_share():
    """`hint_share=X` on a registered environment (a target, not a synthesized one): GRPO's rollouts hint that
    share of each group with the task's guidance from its reference actions; the reference names another
    environment (another artifact id); a share outside [0, 1) is refused."""
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.synthetic.hints import OPEN, HintedEnv, guidance

    env = make_env("shop-ladder?hint_share=0.25")
    assert env.hint_share == 0.25 and getattr(make_env("shop-ladder"), "hint_share", 0.0) == 0.0
    obs = HintedEnv(env).reset(300001)
    assert OPEN in obs.system_prompt and guidance(env.reference_actions()) in obs.system_prompt
    assert env_identity("shop-ladder?hint_share=0.25")["id"] != env_identity("shop-ladder")["id"]
    for bad in ("1.5", "-0.1", "yes"):
        with pytest.raises(UsageError, match="hint_share"):
            make_env(f"shop?hint_share={bad}")


def test_a_mixture_takes_turns_between_its_members():
    """`mixture`: seed s is member s % n's task at seed s // n; the episode is entirely the member's (reward,
    reference); its identity is its members' in order; one member, a nested mixture or another key is refused."""
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.rollout import replay

    mix = make_env({"name": "mixture", "params": {"envs": ["shop", "shop-mixed?hint_share=0.5"]}})
    shop, mixed = make_env("shop"), make_env("shop-mixed")
    for seed in range(4):
        member, own = (shop, mixed)[seed % 2], seed // 2
        assert mix.reset(seed) == member.reset(own)
        assert mix.task_metadata() == member.task_metadata()
        assert mix.reference_actions() == member.reference_actions()
        assert replay(mix, seed, mix.reference_actions()).reward == 1.0
        assert mix.hint_share_of(seed) == (0.0, 0.5)[seed % 2]
    assert "mixture" in list_envs()
    ab, ba = (env_identity(f"mixture?envs={x}")["id"] for x in ("shop,shop-mixed", "shop-mixed,shop"))
    assert ab != ba and ab["members"] == [env_identity("shop")["id"], env_identity("shop-mixed")["id"]]
    for bad in ("mixture?envs=shop", "mixture?envs=shop,mixture", "mixture?envs=shop,shop&n=2"):
        with pytest.raises(UsageError, match="mixture"):
            make_env(bad)
