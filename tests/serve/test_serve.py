"""`trace serve` as a real server process on a loopback port, driven by the official `openai` client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import tinymodel  # noqa: E402
from trace_testing import BIN, run_cli  # noqa: E402

openai = pytest.importorskip("openai")


def _http(method, url, body=None, headers=None, timeout=30):
    """(status, JSON body) of a raw request (bodies the SDK would refuse to send)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The shared tiny model as store://model/tiny, served with an API key; yields (base_url, store, proc)."""
    tiny = tinymodel.tiny(tmp_path_factory)
    store = tiny.store_root
    from trace_cli.store import Store

    Store(store).set_name("model", "tiny", tiny.id)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"}
    proc = subprocess.Popen(
        [str(BIN / "trace"), "serve", "store://model/tiny", "--port", str(port), "--store", str(store)]
        + ["--api-key", "k3y", "--max-tokens", "48"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stderr.read()}")
        try:
            if _http("GET", f"{base}/models", headers={"Authorization": "Bearer k3y"}, timeout=1)[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("server did not start in 90 s")
    yield base, store, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look up an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]


def test_chat_completion_with_tools(server):
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    messages = [
        {"role": "system", "content": "You are a shop agent."},
        {"role": "user", "content": "Where is order #W1000001?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1000001"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "delivered"}'},
    ]
    r = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=16, n=2
    )
    assert r.object == "chat.completion" and len(r.choices) == 2
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy: same twice
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert 0 < r.usage.completion_tokens <= 32 and r.usage.prompt_tokens > 20
    for c in r.choices:
        for tc in c.message.tool_calls or []:
            assert tc.type == "function" and isinstance(json.loads(tc.function.arguments), dict)
    # streaming gives the same text
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=16, temperature=0, stream=True
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == (r.choices[0].message.content or "")
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens // 2


def test_bad_requests_get_openai_errors(server):
    base, _, _ = server
    h = {"Authorization": "Bearer k3y"}
    for body, param in (
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
                "tools": TOOLS,
            },
            "tool_choice",
        ),
    ):
        status, doc = _http("POST", f"{base}/chat/completions", body, h)
        assert status == 400, doc
        err = doc["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["param"] == param, err
    status, doc = _http("POST", f"{base}/chat/completions", b"{not json", h)
    assert status == 400 and doc["error"]["message"]
    body = {"model": "other", "messages": [{"role": "user", "content": "x"}]}
    status, doc = _http("POST", f"{base}/chat/completions", body, h)
    assert status == 404 and doc["error"]["code"] == "model_not_found"
    client = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=base, api_key="k3y", max_retries=0).chat.completions.create(
            model="tiny", messages=[]
        )


def test_served_eval_equals_direct_eval(server, tmp_path):
    """Greedy eval through `openai:` (the server batching concurrent requests) = direct eval, message by message."""
    base, store, _ = server
    common = ["--env", "shop", "--seeds", "0:4", "--max-turns", "4", "--max-new-tokens", "32", "--json"]
    direct = run_cli("eval", "--model", "store://model/tiny", *common, "--store", store)
    assert direct.exit_code == 0, direct.output
    served = run_cli(
        "eval",
        "--model",
        f"openai:{base}?model=tiny&api_key_env=SERVE_KEY",
        *common,
        "--store",
        store,
        env={"SERVE_KEY": "k3y"},
    )
    assert served.exit_code == 0, served.output
    from trace_cli.store import Store
    from trace_cli.store.rollouts import read_episodes

    st = Store(store)
    eps = [
        {e["episode_id"]: e for e in read_episodes(st.resolve(json.loads(r.stdout)["rollouts"]).path)}
        for r in (direct, served)
    ]
    assert sorted(eps[0]) == sorted(eps[1])
    for eid, e in eps[0].items():
        assert e["messages"] == eps[1][eid]["messages"], eid
        assert (e["reward"], e["success"], e["termination_reason"]) == (
            eps[1][eid]["reward"],
            eps[1][eid]["success"],
            eps[1][eid]["termination_reason"],
        )


def test_ctrl_c_shuts_down_cleanly(server):
    _, _, proc = server
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "server stopped" in err and "Traceback" not in err


def test_serve_refuses_what_it_cannot_serve(tmp_path):
    r = run_cli("serve", "policy:reference", "--store", tmp_path / "s")
    assert r.exit_code == 2 and "serves local models" in r.output
