"""An OpenAI-compatible endpoint is untrusted (issue 46, items 2 and 4): it cannot hold a run past the answer's
total deadline (a server that trickles bytes never trips the per-read timeout), nor flood its memory past the
answer's size cap, and a malformed answer is a clear error (or a malformed action), never an internal one. A
real HTTP server on loopback plays the bad endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from trace_cli.agents.openai_policy import OpenAIPolicy
from trace_cli.errors import UsageError
from trace_cli.llm.openai_client import ChatClient, MalformedReply, Reply, Unavailable, parse_ref


def _completion(message, **extra) -> bytes:
    return json.dumps(
        {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message}], **extra}
    ).encode()


DEEP_ARGS = "[" * 100_000 + "]" * 100_000
MALFORMED = {
    "content-object": (_completion({"role": "assistant", "content": {"text": "hi"}}), "json"),
    "message-null": (_completion(None), "json"),
    "usage-string": (_completion({"role": "assistant", "content": "hi"}, usage="lots"), "json"),
    "deep-arguments": (
        _completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": DEEP_ARGS}}
                ],
            }
        ),
        "json",
    ),
    "deep-body": (b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "json"),
    "html": (b"<html><body>502 Bad Gateway\x1b]0;pwned\x07</body></html>", "html"),
    "truncated": (_completion({"role": "assistant", "content": "hi"})[:-7], "json"),
    "huge-int": (
        b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], "usage": {"completion_tokens": '
        + b"9" * 5000
        + b"}}",
        "json",
    ),
    "choices-string": (b'{"choices": "none"}', "json"),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        case = self.path.strip("/").split("/")[0]
        try:
            if case == "trickle":  # headers at once, then one byte of body every 0.5 s, for ever
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                while not self.server.stopping:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.5)
                return
            if case == "trickle-headers":  # the status line and headers one byte every 0.5 s
                for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000:
                    if self.server.stopping:
                        return
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.5)
                return
            if case == "flood":  # 64 MB of a JSON string, streamed
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(64 << 20))
                self.end_headers()
                chunk = b" " * (1 << 20)
                for _ in range(64):
                    self.wfile.write(chunk)
                return
            if case == "error-body":
                body = json.dumps({"error": {"message": "bad model \x1b]52;c;ZWNobyBoaQ==\x07\roverwritten"}})
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
                return
            if case == "big":  # a valid completion of 0.9 MB
                body = _completion({"role": "assistant", "content": "x" * 900_000})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            body, ctype = MALFORMED[case]
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if ctype == "html" else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            return


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.stopping = False
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.stopping = True
    srv.shutdown()


def _policy(url: str, case: str, extra: str = "") -> OpenAIPolicy:
    ep = parse_ref(f"openai:{url}/{case}/v1?model=m&timeout=5&max_retries=1{extra}")
    return OpenAIPolicy(ep, temperature=0.0, top_p=1.0, max_new_tokens=8, seed=0)


def _state():
    """What the policy reads of an episode in flight: its messages and tools."""
    return SimpleNamespace(messages=[{"role": "user", "content": "hi"}], tools=[])


def _in_thread(fn, patience: float = 90.0):
    """(finished, result or exception) of fn() on a daemon thread (a hang would be for ever: the server
    trickles until the test module ends)."""
    box: dict = {}

    def run():
        try:
            box["r"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["r"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(patience)
    return not t.is_alive(), box.get("r")


@pytest.mark.parametrize("case", ["trickle", "trickle-headers"])
def test_a_trickling_endpoint_ends_at_the_total_deadline(server, case):
    policy = _policy(server, case, "&deadline=3")
    finished, r = _in_thread(lambda: policy._request(_state()))
    assert finished, "the answer was not bounded by its total deadline"
    assert isinstance(r, UsageError), r
    assert "no complete answer within 3 s" in r.message and "deadline" in str(r), str(r)


def test_a_trickling_endpoint_ends_the_analysts_answer_at_its_deadline(server):
    ep = parse_ref(f"openai:{server}/trickle/v1?model=m&timeout=5&max_retries=2&deadline=3")
    chat = ChatClient(ep, json_mode=True)
    finished, r = _in_thread(lambda: chat.complete([{"role": "user", "content": "hi"}]))
    assert finished, "the answer was not bounded by its total deadline"
    assert isinstance(r, Unavailable) and "no complete answer within 3 s" in str(r), r


def test_a_flooding_endpoint_is_cut_at_the_size_cap(server):
    policy = _policy(server, "flood", "&max_answer_mb=2")
    finished, r = _in_thread(lambda: policy._request(_state()))
    assert finished
    assert isinstance(r, UsageError), r
    assert "larger than 2 MB" in r.message and "max_answer_mb" in str(r), str(r)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_is_a_clear_error_or_a_malformed_action(server, case):
    policy = _policy(server, case)
    try:
        actions, used = policy._request(_state())
    except UsageError as e:
        assert "malformed answer" in e.message, e.message
        assert "\x1b" not in e.message
        return
    # an answer that stands: text or actions, the bad parts as malformed actions; usage ignored when bad
    assert case in ("usage-string", "deep-arguments", "huge-int"), (case, actions)
    assert used == 0
    if case == "deep-arguments":
        assert actions[0]["error"] == "`arguments` is not a JSON object"


def test_the_analysts_reply_parsing_is_never_an_internal_error():
    for body, _ in MALFORMED.values():
        try:
            Reply(body, 1).text()
        except MalformedReply:
            pass


def test_an_error_body_is_escaped(server):
    policy = _policy(server, "error-body")
    with pytest.raises(UsageError) as e:
        policy._request(_state())
    text = str(e.value)
    assert "bad model" in text and "\x1b" not in text and "\r" not in text and "\\x1b]52" in text, text


def test_limits_are_checked_in_the_reference():
    for bad in ("deadline=0", "deadline=x", "max_answer_mb=-1", "max_answer_mb=inf"):
        with pytest.raises(UsageError):
            parse_ref(f"openai:http://127.0.0.1:9/v1?model=m&{bad}")
    ep = parse_ref("openai:http://127.0.0.1:9/v1?model=m&deadline=7&max_answer_mb=3")
    assert (ep.deadline, ep.max_answer_mb) == (7.0, 3.0)


class _Episode:  # what the policy reads of an episode in flight (one object per episode)
    def __init__(self):
        self.messages = [{"role": "user", "content": "hi"}]
        self.tools = []


def test_an_endpoints_answers_have_an_episode_and_a_run_budget(server):
    """Answers just under the per-answer cap (max_answer_mb=1): the third of one episode passes its budget
    (2 answers' worth), and a run of one-answer episodes passes the run's (32 answers' worth)."""
    policy = _policy(server, "big", "&max_answer_mb=1")
    ep = _Episode()
    policy._request(ep)
    policy._request(ep)
    with pytest.raises(UsageError, match=r"exceed an episode's budget \(2 MB"):
        policy._request(ep)
    policy = _policy(server, "big", "&max_answer_mb=1")
    with pytest.raises(UsageError, match=r"exceed the run's budget \(32 MB"):
        for _ in range(40):
            policy._request(_Episode())


def test_ctrl_c_ends_an_eval_waiting_on_a_trickling_endpoint(server, tmp_path):
    """The policy's requests run on threads, which the interpreter joins at exit: Ctrl-C must end the answers
    being read (the deadline here is the default 600 s), not wait for them."""
    exe = Path(sys.executable).parent / "trace"
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    env.pop("TRACE_STORE", None)
    proc = subprocess.Popen(
        [str(exe), "eval", "--env", "shop", "--seeds", "0:2", "--store", str(tmp_path / "store")]
        + ["--model", f"openai:{server}/trickle/v1?model=m&timeout=30"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        time.sleep(8)  # the requests are sent and being trickled
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("Ctrl-C did not end a run waiting on the endpoint")
        assert proc.returncode == 130, err
        assert b"interrupted" in err and b"internal error" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_diagnose_on_a_trickling_endpoint_ends_at_the_deadline(server, tmp_path):
    """`trace diagnose --analyst openai` on a server that never completes an answer: it gives up on the
    server after the answers in flight reach llm.deadline_s, instead of holding the run for ever."""
    from trace_testing import episode, run_trace, write_jsonl

    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode(f"e{i}", reward=float(i % 2)) for i in range(6)])
    assert run_trace("ingest", "jsonl", f, "--store", store, "--name", "r").returncode == 0
    r = run_trace(
        "diagnose",
        "--rollouts",
        "store://rollouts/r",
        "--analyst",
        "openai",
        "--base-url",
        f"{server}/trickle/v1",
        "--llm-model",
        "m",
        "--set",
        "llm.deadline_s=3",
        "--set",
        "llm.timeout_s=30",
        "--set",
        "llm.max_retries=0",
        "--set",
        "llm.cache=false",
        "--store",
        store,
        timeout=240,
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "no complete answer within 3 s" in r.stderr and "internal error" not in r.stderr, r.stderr
