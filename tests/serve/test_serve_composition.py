"""`trace serve store://composition/NAME` routes as eval does: a router composition served as a real server
process decides on each request's messages (the conversation up to the user turn at which eval routes), so a
greedy served completion and its routing decision (the x-trace-route header) equal the composition policy's
own, and served eval equals direct eval of the composition."""

# ruff: noqa: F811  (pytest fixtures imported from compose_helpers)
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from compose_helpers import composed_store, tiny  # noqa: E402, F401
from serve_testing import call_exchange, episodes_by_id, free_port  # noqa: E402
from trace_testing import BIN, run_cli  # noqa: E402

from trace_cli.stages.base import execute  # noqa: E402

openai = pytest.importorskip("openai")

NAME = "serve-router"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served_router(composed_store):
    """A router composition (re-routing at every user turn) served on loopback; yields (base_url, store, art)."""
    st = composed_store
    art = execute(
        "compose",
        {"method": "router", "adapters": ["structured", "tool"], "router": {"reroute": "user_turn"}},
        st,
        name=NAME,
    ).main
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"}
    cmd = [str(BIN / "trace"), "serve", f"store://composition/{NAME}", "--port", str(port)]
    cmd += ["--store", str(st.root), "--max-tokens", str(MAX_TOKENS)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=2)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stderr.read()}")
        try:
            assert [m.id for m in client.models.list().data] == [NAME]
            break
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("server did not start in 120 s")
            time.sleep(0.2)
    yield base, st, art
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _served(base, state):
    """The served completion for the episode's conversation so far: (message, routing decision)."""
    from trace_cli.agents.openai_policy import to_openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=NAME,
        messages=to_openai(state.messages),
        tools=state.tools,
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    return raw.parse().choices[0].message, json.loads(raw.headers["x-trace-route"])


def _same(served_msg, direct_text: str, policy) -> None:
    """The served message is the direct turn parsed as the server parses every turn."""
    from trace_cli.serve.completion import to_completion

    want = to_completion(
        direct_text, [], index=0, max_tokens=MAX_TOKENS, parse_tools=True, stop=[], eos_id=policy.eos,
        parse=policy.parse,
    )  # fmt: skip
    assert served_msg.content == want.content
    got_calls = [(c.function.name, json.loads(c.function.arguments)) for c in served_msg.tool_calls or []]
    assert got_calls == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in want.tool_calls
    ]


def _close(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)


def test_served_router_completion_and_route_equal_the_policy(served_router, tiny):
    """Turn by turn, as eval drives the policy: the first turn, a new user turn (re-routed), then a turn after
    a tool result (not re-routed: the decision of the user turn stands, though the conversation grew)."""
    from trace_cli.compose.policy import load_composition_policy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import start

    base, _, art = served_router
    pol = load_composition_policy(art.path, tiny.hf, max_new_tokens=MAX_TOKENS, temperature=0.0)
    st = start(make_env("shop"), 3)
    additions = [
        [
            {"role": "assistant", "content": "Let me look into that."},
            {"role": "user", "content": "Also, what is the status of my order #W2000002?"},
        ],
        call_exchange(
            "call_9",
            "get_order_details",
            {"order_id": "#W2000002"},
            '{"order_id": "#W2000002", "status": "pending", "items": []}',
            name="get_order_details",
        ),
    ]
    routes = []
    for step in range(3):
        if step:
            st.messages += additions[step - 1]
        (direct,) = pol.act([st])
        decision = st.compose_route["decisions"][-1]
        msg, route = _served(base, st)
        assert _close(route, decision), (step, route, decision)
        _same(msg, direct.raw, pol)
        routes.append(route)
    assert len(pol.decisions) == 2  # routed at the two user turns only, as in eval
    # exact: no new user turn, so the decision of step 1 is reused, not recomputed
    assert routes[2] == routes[1]


def test_served_eval_of_a_router_equals_direct_eval(served_router):
    base, st, _ = served_router
    common = ["--env", "shop", "--seeds", "0:3", "--max-turns", "3", "--max-new-tokens", str(MAX_TOKENS)]
    direct = run_cli("eval", "--model", f"store://composition/{NAME}", *common, "--json", "--store", st.root)
    assert direct.exit_code == 0, direct.output
    served = run_cli("eval", "--model", f"openai:{base}?model={NAME}", *common, "--json", "--store", st.root)
    assert served.exit_code == 0, served.output
    eps = episodes_by_id(st, direct, served)
    assert sorted(eps[0]) == sorted(eps[1])
    for eid, e in eps[0].items():
        assert e["messages"] == eps[1][eid]["messages"], eid


def test_composition_refs_load_the_composition_policy(served_router, tiny):
    """`store://composition/NAME` in eval and serve is the composition, not its base model."""
    from trace_cli.compose.policy import RouterPolicy, load_policy
    from trace_cli.models.refs import resolve_model

    _, st, _ = served_router
    ref = resolve_model(f"store://composition/{NAME}", st)
    pol = load_policy(ref, temperature=0.0, max_new_tokens=4)
    assert isinstance(pol, RouterPolicy) and pol.name == ref.display
    assert [s.name for s in pol.skills] == ["base", "structured_data_reasoning", "tool_calling_precision"]
    merged = execute("compose", {"method": "merge", "adapters": ["structured", "tool"]}, st, name="m").main
    pol = load_policy(resolve_model("store://composition/m", st), temperature=0.0, max_new_tokens=4)
    base = load_policy(resolve_model(str(tiny.hf)), temperature=0.0, max_new_tokens=4)
    w = dict(pol.model.named_parameters())
    # exact: any difference at all shows the merged weights are loaded
    assert any(
        not w[n].equal(p) for n, p in base.model.named_parameters()
    )  # the merged weights, not the base
    assert merged.id
