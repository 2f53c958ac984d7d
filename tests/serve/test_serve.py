"""`trace serve` as a real server process on a loopback port, driven by the official `openai` client."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import tinymodel  # noqa: E402
from serve_testing import call_exchange, episodes_by_id, free_port  # noqa: E402
from trace_testing import BIN, run_cli  # noqa: E402

openai = pytest.importorskip("openai")
_KEY = {"Authorization": "Bearer k3y"}


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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The shared tiny model as store://model/tiny, served with an API key; yields (base_url, store, proc)."""
    tiny = tinymodel.tiny(tmp_path_factory)
    store = tiny.store_root
    from trace_cli.store import Store

    Store(store).set_name("model", "tiny", tiny.id)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"}
    log = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    proc = subprocess.Popen(
        [str(BIN / "trace"), "serve", "store://model/tiny", "--port", str(port), "--store", str(store)]
        + ["--api-key", "k3y", "--max-tokens", "48", "--prefill-chunk", "16"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),  # a file: a pipe nobody reads would fill with the per-request log lines
        text=True,
    )
    proc.log = log
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {log.read_text()}")
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
        *call_exchange("c1", "get_order_details", '{"order_id": "#W1000001"}', '{"status": "delivered"}'),
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
            model="tiny",
            messages=messages,
            tools=TOOLS,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == (r.choices[0].message.content or "")
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens // 2


def test_bad_requests_get_openai_errors(server):
    base, _, _ = server
    h = _KEY
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


def _raw(base: str, request: bytes) -> bytes:
    host, port = base.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        return s.recv(65536)


def test_a_non_utf8_key_is_refused_and_no_log_line_carries_controls(server):
    """Issue 46: an Authorization header that is not UTF-8 is a wrong key (401), not a 500 with a traceback;
    a path with terminal controls is logged escaped."""
    base, _, proc = server
    head = _raw(
        base,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n",
    )
    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    ok = _raw(
        base,
        b"GET /v1/models%1b]0;pwned%07 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nConnection: close\r\n\r\n",
    )
    assert ok.startswith(b"HTTP/1.1 404"), ok[:200]
    deadline = time.monotonic() + 30
    while "pwned" not in proc.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = proc.log.read_text()
    assert "\\x1b]0;pwned" in log and "\x1b" not in log and "Traceback" not in log, log[-2000:]


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

    eps = episodes_by_id(Store(store), direct, served)
    assert sorted(eps[0]) == sorted(eps[1])
    for eid, e in eps[0].items():
        assert e["messages"] == eps[1][eid]["messages"], eid
        assert (e["reward"], e["success"], e["termination_reason"]) == (
            eps[1][eid]["reward"],
            eps[1][eid]["success"],
            eps[1][eid]["termination_reason"],
        )


TWO_TOOLS = TOOLS + [
    {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "description": "Cancel an order that has not shipped.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["order_id", "reason"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "Please cancel order #W1000001, I ordered it by mistake."}]


def test_tool_choice_required_and_named_return_that_call(server):
    """The tiny model never writes a call on its own (it writes newlines): only the prefill makes one."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    auto = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TWO_TOOLS, tool_choice="auto", temperature=0, max_tokens=12
    )
    assert not auto.choices[0].message.tool_calls  # so what follows is the server's doing
    names = {t["function"]["name"] for t in TWO_TOOLS}
    r = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TWO_TOOLS, tool_choice="required", temperature=0, max_tokens=24
    )
    c = r.choices[0]
    # a call-only reply: content null; the tiny model never closes the call (newlines): max_tokens cuts it
    assert c.finish_reason == "length" and c.message.content is None
    assert len(c.message.tool_calls) == 1 and c.message.tool_calls[0].function.name in names
    for name in sorted(names):
        for stream in (False, True):
            kw = dict(model="tiny", messages=ASK, tools=TWO_TOOLS, temperature=0, max_tokens=24)
            choice = {"type": "function", "function": {"name": name}}
            if not stream:
                r = client.chat.completions.create(tool_choice=choice, **kw)
                got = [tc.function.name for tc in r.choices[0].message.tool_calls]
                assert got == [name] and r.choices[0].message.content is None
                continue
            chunks = list(client.chat.completions.create(tool_choice=choice, stream=True, **kw))
            calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
            assert [tc.function.name for tc in calls] == [name]
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    # "none": the tools are not offered and nothing is parsed as a call, even text that looks like one
    r = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TWO_TOOLS, tool_choice="none", temperature=1, seed=3, max_tokens=24
    )
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls"


def test_a_call_cut_by_max_tokens_is_length(server):
    """After the forced prefill the tiny model writes newlines: its call never closes, so max_tokens always
    cuts it. That is finish_reason "length" with the arguments as far as written (none), never a
    complete-looking `{}` as "tool_calls", streamed or not; the call's stream has no `content: ""`."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    kw = dict(model="tiny", messages=ASK, tools=TWO_TOOLS, tool_choice="required", temperature=0)
    for m in (3, 24):  # cut inside the prefill, and after it
        cut = client.chat.completions.create(max_tokens=m, **kw).choices[0]
        assert cut.finish_reason == "length" and cut.message.content is None
        assert [tc.function.arguments for tc in cut.message.tool_calls] == [""]
    chunks = list(client.chat.completions.create(max_tokens=24, stream=True, **kw))
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "length"
    assert all(ch.choices[0].delta.content is None for ch in chunks)  # no `content: ""` in a call's deltas
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [tc.function.arguments for ch in chunks for tc in ch.choices[0].delta.tool_calls or []] == [""]


def test_requests_openai_refuses_get_its_400s(server):
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    calls = call_exchange("c1", "get_order_details", '{"order_id": "#W1"}', "{}")
    for messages, param, says in (
        ([*ASK, calls[1]], "messages.[1].role", "must be a response to a preceeding message"),
        (
            [*ASK, calls[0], {"role": "tool", "content": "{}"}],
            "messages.[2].tool_call_id",
            "Missing required",
        ),
        ([*ASK, calls[0], {**calls[1], "tool_call_id": "c9"}], "messages.[2].tool_call_id", "'c9' not found"),
        ([*ASK, calls[0], *ASK], "messages.[1].role", "did not have response messages: c1"),
        ([{"role": "user", "content": None}], "messages.[0].content", "expected a string, got null"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=4)
        assert e.value.body["param"] == param and says in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=4, response_format={"type": "json_object"}
        )
    assert e.value.body["param"] == "response_format" and "not supported" in e.value.body["message"]
    r = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=4, response_format={"type": "text"}
    )
    assert r.choices[0].finish_reason == "length"
    status, doc = _http("POST", f"{base}/chat/completions", b'{"model": "tiny", "messages": [}', _KEY)
    assert status == 400 and doc["error"]["param"] is None, doc
    assert "could not parse the JSON body" in doc["error"]["message"]
    assert "Expecting value (at character 31)" in doc["error"]["message"]


def test_streams_as_openai_does(server):
    """The usage chunk (empty choices) only with stream_options.include_usage; content as generated: the
    tiny model's whitespace is content, not stripped, streamed or not."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=6)
    plain = list(client.chat.completions.create(stream=True, **kw))
    assert all(ch.choices and ch.usage is None for ch in plain)
    assert plain[0].choices[0].delta.content == ""  # not a tool stream: OpenAI's empty first content
    counted = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert counted[-1].choices == [] and counted[-1].usage.completion_tokens == 6
    assert all(ch.choices for ch in counted[:-1])
    whole = client.chat.completions.create(**kw).choices[0].message.content
    assert whole and not whole.strip()  # whitespace as generated
    assert "".join(ch.choices[0].delta.content or "" for ch in plain) == whole


def test_prompt_beyond_the_context_is_context_length_exceeded(server):
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    long = [{"role": "user", "content": "order " * 5000}]  # the tiny model's context is 4,096 tokens
    for kw in ({"max_tokens": 16}, {}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=long, **kw)
        assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
        err = e.value.body
        assert err["type"] == "invalid_request_error" and err["param"] == "messages"
        assert "maximum context length is 4096 tokens" in err["message"]
    # fits alone, not with max_tokens: refused; without max_tokens the completion gets what fits
    fits = [{"role": "user", "content": "order " * 3500}]
    n = client.chat.completions.create(model="tiny", messages=fits, max_tokens=1).usage.prompt_tokens
    assert 3000 < n < 4096
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=fits, max_tokens=4096 - n + 1)
    assert e.value.code == "context_length_exceeded"
    r = client.chat.completions.create(model="tiny", messages=fits, max_tokens=4096 - n, temperature=0)
    assert r.usage.total_tokens <= 4096


def test_stop_strings_end_generation(server):
    """A stop string ends generation where it appears: the content stops before it, fewer tokens are made."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    kw = dict(model="tiny", messages=ASK, temperature=1.0, seed=7, max_tokens=40)
    full = client.chat.completions.create(**kw)
    text = full.choices[0].message.content
    assert full.usage.completion_tokens == 40 and len(text) > 40, text  # sampled text, to max_tokens
    again = client.chat.completions.create(**kw)
    assert again.choices[0].message.content == text  # seeded sampling is reproducible
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.chat.completions.create(stop=[stop, "\x00never"], **kw)
    c = cut.choices[0]
    assert c.message.content == text[: text.find(stop)] and c.finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens
    streamed = list(client.chat.completions.create(stop=stop, stream=True, **kw))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == c.message.content


def test_tokens_stream_as_they_are_generated(server):
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    t0 = time.monotonic()
    first = None
    stream = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        temperature=0.8,
        seed=1,
        max_tokens=600,
        stream=True,
        stream_options={"include_usage": True},
    )
    n_content = 0
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            n_content += 1
            first = first if first is not None else time.monotonic() - t0
    total = time.monotonic() - t0
    assert ch.usage.completion_tokens > 100  # the last chunk (sampling may end it before 600)
    assert n_content > 50  # token by token, not one block
    assert first is not None and first < total / 4, (first, total)


def test_a_client_that_disconnects_frees_the_server(server):
    """A stream closed after a few chunks and a request whose client times out both stop generating at
    once (the server's /stats show nothing running within 1 s), and the next request is served at once."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    h = {"Authorization": "Bearer k3y"}
    root = base.rsplit("/v1", 1)[0]
    assert _http("GET", f"{root}/stats", headers=h)[1]["running"] == 0
    # greedy, the tiny model writes newlines to max_tokens: ~20 s of work
    long = dict(model="tiny", messages=ASK, temperature=0, max_tokens=3000)
    stream = client.chat.completions.create(stream=True, **long)
    next(iter(stream))  # the role chunk: generation has started
    assert _http("GET", f"{root}/stats", headers=h)[1]["running"] == 1
    stream.close()
    t = time.monotonic()
    while _http("GET", f"{root}/stats", headers=h)[1]["running"]:
        assert time.monotonic() - t < 1.0, "generation went on after the client disconnected"
        time.sleep(0.02)
    # non-streaming: the client gives up after 1 s
    impatient = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(**long)
    t = time.monotonic()
    while _http("GET", f"{root}/stats", headers=h)[1]["running"]:
        assert time.monotonic() - t < 1.0, "generation went on after the client timed out"
        time.sleep(0.02)
    t = time.monotonic()
    client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
    assert time.monotonic() - t < 1.0


def test_concurrent_requests_share_the_running_batch(server):
    """A request that arrives while another is generating joins its batch between tokens (continuous
    batching) and is done long before it; it gets the completion it gets alone."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    h = {"Authorization": "Bearer k3y"}
    root = base.rsplit("/v1", 1)[0]
    short = dict(model="tiny", messages=ASK, temperature=1.0, seed=2, max_tokens=10)
    alone = client.chat.completions.create(**short).choices[0].message.content
    # greedy, the tiny model writes newlines to max_tokens: ~20 s of work
    stream = client.chat.completions.create(
        model="tiny", messages=ASK, temperature=0, max_tokens=3000, stream=True
    )
    next(iter(stream))  # the long one is generating
    got = client.chat.completions.create(**short).choices[0].message.content
    stats = _http("GET", f"{root}/stats", headers=h)[1]
    stream.close()
    assert stats["running"] == 1 and stats["max_running"] >= 2  # it joined; the long one still runs
    assert got == alone


def _stats(base: str) -> dict:
    return _http("GET", f"{base.rsplit('/v1', 1)[0]}/stats", headers=_KEY)[1]


def test_a_long_prompt_is_prefilled_in_chunks_between_decode_steps(server):
    """A 3,000-token prompt that arrives while a stream decodes is prefilled 16 tokens a pass (the server's
    --prefill-chunk) with a decode step of the stream between two passes: it holds the stream up for one
    chunk at most, never for its whole prefill."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny", messages=ASK, temperature=0, max_tokens=3000, stream=True
    )
    # the stream is decoding once it has sent text (its first chunk, the role, may come before its own prefill ends,
    # whose chunks would then count below)
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    before = _stats(base)
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi " + "order " * 3000}],
        temperature=0,
        max_tokens=2,
    )
    after = _stats(base)
    stream.close()
    fed = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
    chunks = after["prefill_chunks"] - before["prefill_chunks"]
    assert fed > 2500 and chunks == -(-fed // 16), (fed, before, after)
    assert after["steps_in_prefill"] - before["steps_in_prefill"] >= chunks - 1, (before, after)


def test_a_client_gone_during_prefill_stops_it_between_chunks(server):
    """A stream closed while its long prompt is being prefilled stops the prefill at the next chunk: the
    server runs nothing within 1 s, and most of the prompt was never fed."""
    base, _, _ = server
    client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
    before = _stats(base)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Bye " + "order " * 3000}],
        max_tokens=4,
        stream=True,
    )
    next(iter(stream))  # the role chunk: admitted, prefilling
    stream.close()
    t = time.monotonic()
    while _stats(base)["running"]:
        assert time.monotonic() - t < 1.0, "the prefill went on after the client disconnected"
        time.sleep(0.02)
    after = _stats(base)
    assert after["prefills_cancelled"] == before["prefills_cancelled"] + 1
    assert after["prefill_tokens"] - before["prefill_tokens"] < 1500, (before, after)


def test_ctrl_c_shuts_down_cleanly(server):
    _, _, proc = server
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    err = proc.log.read_text()
    assert proc.returncode == 0, err
    assert "server stopped" in err and "Traceback" not in err
    # one line per request: method, path, status, model, token counts, latency
    lines = [ln for ln in err.splitlines() if "POST /v1/chat/completions" in ln]
    assert any(
        re.search(r"status=200 model=tiny prompt_tokens=\d+ completion_tokens=\d+ latency_ms=\d+", ln)
        for ln in lines
    ), err[-2000:]
    assert any("status=400" in ln and "completion_tokens" not in ln for ln in lines)
    assert any(re.search(r"status=499 .*completion_tokens=\d+ stream=true", ln) for ln in lines)


def test_serve_refuses_what_it_cannot_serve(tmp_path):
    r = run_cli("serve", "policy:reference", "--store", tmp_path / "s")
    assert r.exit_code == 2 and "serves local models" in r.output


def test_help_shows_an_offline_tau2_command_without_keys_in_its_args():
    """τ²-bench writes --agent-llm-args/--user-llm-args into results.json: the key comes from the environment,
    both LLMs are local servers, and the temperature is stated."""
    r = run_cli("serve", "--help")
    assert r.exit_code == 0
    text = r.output
    start = text.index("tau2 run")
    cmd = text[start : text.index("}'", text.index("--user-llm-args", start)) + 2]
    assert "--agent-llm openai/" in cmd and "--user-llm openai/" in cmd
    assert cmd.count('"api_base": "http://127.0.0.1:') == 2 and cmd.count('"temperature": 0.0') == 2
    assert "api_key" not in cmd and "OPENAI_API_KEY=" in text[:start]
