"""API models as policies: `openai:URL?model=NAME` references, the OpenAI policy on the shop world, errors."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest
from trace_testing import run_cli

from trace_cli.agents.openai_policy import OpenAIPolicy, to_actions, to_openai
from trace_cli.compose.policy import load_policy
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout
from trace_cli.errors import UsageError
from trace_cli.llm.openai_client import parse_ref
from trace_cli.models.refs import resolve_model


def test_ref_parsing():
    ep = parse_ref("openai:http://127.0.0.1:8000/v1/?model=base&timeout=5&max_retries=0&concurrency=2")
    assert (ep.base_url, ep.model, ep.timeout, ep.max_retries, ep.concurrency) == (
        "http://127.0.0.1:8000/v1",
        "base",
        5.0,
        0,
        2,
    )
    ref = resolve_model("openai:http://127.0.0.1:8000/v1?model=base")
    assert ref.kind == "openai" and ref.display == "openai:http://127.0.0.1:8000/v1?model=base"
    for bad, msg in (
        ("openai:http://h:1/v1", "names no model"),
        ("openai:ftp://h/v1?model=m", "not an http(s) URL"),
        ("openai:http://h:1/v1?model=m&api_key=sk", "unknown parameter(s) api_key"),
        ("openai:http://h:1/v1?model=m&timeout=x", "timeout must be a number"),
    ):
        with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            resolve_model(bad)


def _fn(name, arguments):
    return SimpleNamespace(function=SimpleNamespace(name=name, arguments=arguments))


def test_response_to_actions():
    assert to_actions(SimpleNamespace(content="<think>x</think>Hi", tool_calls=None)) == "<think>x</think>Hi"
    acts = to_actions(
        SimpleNamespace(content="Checking.", tool_calls=[_fn("a", '{"x": 1}'), _fn("b", "[1]"), _fn("c", "")])
    )
    assert acts[0] == {"content": "Checking."}
    assert acts[1] == {"name": "a", "arguments": {"x": 1}}
    assert (
        acts[2]["error"] == "`arguments` is not a JSON object"
        and json.loads(acts[2]["malformed"])["name"] == "b"
    )
    assert acts[3] == {"name": "c", "arguments": {}}
    msgs = to_openai(
        [
            {"role": "system", "content": "p"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "a", "arguments": {"x": 1}}}
                ],
            },
            {"role": "tool", "tool_call_id": "c0", "name": "a", "content": "ok", "error": False},
        ]
    )
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert msgs[2] == {"role": "tool", "tool_call_id": "c0", "content": "ok"}


class _ReplayClient:
    """A stand-in for `openai.OpenAI` that answers each conversation with its reference solution's next step,
    as a real endpoint would: tool calls in `tool_calls` (arguments as JSON text), messages as content."""

    def __init__(self, plans):
        self.plans = plans
        self.requests = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **kw):
        self.requests.append(kw)
        first_user = next(m["content"] for m in kw["messages"] if m["role"] == "user")
        step = self.plans[first_user].pop(0)
        if "name" in step:
            calls = [
                SimpleNamespace(
                    id="x",
                    function=SimpleNamespace(name=step["name"], arguments=json.dumps(step["arguments"])),
                )
            ]
            msg = SimpleNamespace(content=None, tool_calls=calls)
        else:
            msg = SimpleNamespace(content=step["content"], tool_calls=None)
        return SimpleNamespace(
            choices=[SimpleNamespace(message=msg)], usage=SimpleNamespace(completion_tokens=3)
        )


def test_policy_drives_shop_to_reward_one():
    """Reference actions served as an API model's tool_calls solve every task (structured turns end to end)."""
    seeds = [0, 1, 2, 3]
    plans = {}
    for s in seeds:
        env = make_env("shop")
        obs = env.reset(s)
        plans[obs.messages[0]["content"]] = list(env.reference_actions())
    client = _ReplayClient(plans)
    ref = resolve_model("openai:http://127.0.0.1:9/v1?model=m&concurrency=2")
    policy = OpenAIPolicy(
        parse_ref(ref.extra["ref"]), temperature=0.0, top_p=1.0, max_new_tokens=7, seed=0, client=client
    )
    results = rollout(policy, lambda: make_env("shop"), [(s, 0) for s in seeds], max_turns=12, batch_size=4)
    assert [r.success for r in results] == [True] * len(seeds)
    assert all(r.gen_tokens > 0 for r in results)
    req = client.requests[0]
    assert req["model"] == "m" and req["max_tokens"] == 7 and req["temperature"] == 0.0 and req["tools"]
    policy.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_is_a_usage_error(tmp_path):
    port = _free_port()  # nothing listens there
    r = run_cli(
        "eval", "--model", f"openai:http://127.0.0.1:{port}/v1?model=m&max_retries=0&timeout=5",
        "--env", "shop", "--seeds", "0:1", "--store", tmp_path / "store",
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "cannot connect" in r.output and "trace serve" in r.output
    assert not (tmp_path / "store" / "rollouts").exists() or not any(
        (tmp_path / "store" / "rollouts").iterdir()
    )
    r = run_cli("eval", "--model", "openai:http://h/v1", "--env", "shop", "--store", tmp_path / "store")
    assert r.exit_code == 2 and "names no model" in r.output


def test_load_policy_builds_the_openai_policy(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test")
    ref = resolve_model("openai:https://api.example.invalid/v1?model=gpt&api_key_env=MY_KEY&max_retries=1")
    pol = load_policy(ref, temperature=0.5, top_p=1.0, max_new_tokens=9, seed=0)
    assert isinstance(pol, OpenAIPolicy) and pol.client.api_key == "sk-test"
    assert pol.client.max_retries == 1 and pol.temperature == 0.5 and pol.max_new_tokens == 9


def test_the_policy_samples_only_as_it_is_told(monkeypatch):
    """No sampling default of its own: the stage's config (its schema) owns them, so none given is an error."""
    monkeypatch.setenv("MY_KEY", "sk-test")
    ref = resolve_model("openai:https://api.example.invalid/v1?model=gpt&api_key_env=MY_KEY")
    with pytest.raises(TypeError, match="temperature"):
        OpenAIPolicy(parse_ref(ref.extra["ref"]), top_p=1.0, max_new_tokens=9, seed=0)
    with pytest.raises(TypeError, match="top_p"):
        load_policy(ref, temperature=0.5, max_new_tokens=9, seed=0)
