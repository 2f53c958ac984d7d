"""Fixtures for the analyst tests: handcrafted trajectories and a scripted OpenAI-compatible HTTP server on
loopback (a real `http.server`, real sockets)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# ------------------------------------------------------------------------------------------ trajectories


class EpisodeBuilder:
    """Build stored-episode dicts (what `Trajectory.from_episode` reads) turn by turn."""

    def __init__(
        self,
        eid: str = "ep",
        *,
        success: bool = False,
        task_id: str = "t1",
        reference: list[dict[str, Any]] | None = None,
    ):
        self.eid, self.success, self.task_id, self.reference = eid, success, task_id, reference
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a shop agent. Policy: …"}
        ]
        self._n = 0

    def user(self, text: str) -> EpisodeBuilder:
        self.messages.append({"role": "user", "content": text})
        return self

    def agent(self, text: str) -> EpisodeBuilder:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def call(self, name: str, args: dict[str, Any], result: str, *, error: bool = False) -> EpisodeBuilder:
        self._n += 1
        cid = f"{self.eid}-c{self._n}"
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": dict(args)}}
                ],
            }
        )
        msg = {"role": "tool", "tool_call_id": cid, "content": result}
        if error:
            msg["error"] = True
        self.messages.append(msg)
        return self

    def tool_text(self, text: str) -> EpisodeBuilder:
        self.messages.append({"role": "tool", "content": text})
        return self

    def build(self) -> dict[str, Any]:
        return {
            "episode_id": self.eid,
            "task_id": self.task_id,
            "success": self.success,
            "reward": 1.0 if self.success else 0.0,
            "messages": list(self.messages),
            "reference_actions": self.reference,
        }

    def record(self) -> dict[str, Any]:
        """A JSONL record for `trace ingest jsonl`."""
        rec = {
            "episode_id": self.eid,
            "task_id": self.task_id,
            "reward": 1.0 if self.success else 0.0,
            "success": self.success,
            "messages": list(self.messages),
        }
        if self.reference is not None:
            rec["reference_actions"] = self.reference
        return rec


@pytest.fixture
def ep():
    return EpisodeBuilder


def small_episodes(n_fail: int = 3, n_pass: int = 3) -> list[dict[str, Any]]:
    """Short, realistic episodes: failures cancel without reading; successes read first."""
    out = []
    for i in range(n_fail + n_pass):
        ok = i >= n_fail
        b = EpisodeBuilder(
            f"e{i}",
            success=ok,
            task_id=f"task{i}",
            reference=[
                {"name": "get_order", "arguments": {"order_id": f"#W{i}"}},
                {"name": "cancel_order", "arguments": {"order_id": f"#W{i}"}},
            ],
        )
        b.user(f"Please cancel order #W{i}.")
        if ok:
            b.call("get_order", {"order_id": f"#W{i}"}, f'{{"order_id": "#W{i}", "status": "pending"}}')
        b.call("cancel_order", {"order_id": f"#W{i}"}, '{"status": "cancelled"}')
        b.agent("Thanks for waiting: your order is cancelled.")
        out.append(b.build())
    return out


@pytest.fixture
def episodes():
    return small_episodes()


# ------------------------------------------------------------------------------------------ scripted server

CAP_LINE = re.compile(r"^- ([a-z0-9_]+): ", re.M)


def chat_response(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
    }


def labels_answer(request: dict[str, Any], choose: Callable[[str, str], str] | None = None) -> str:
    """A valid labelling answer for every capability listed in the request's prompt.
    `choose(capability, episode_text) -> label` (default PRESENT)."""
    user = request["messages"][-1]["content"]
    caps = CAP_LINE.findall(user.split("=== EPISODE ===")[0])
    episode = user.split("=== EPISODE ===")[-1]
    labels = [
        {"capability": c, "label": (choose(c, episode) if choose else "PRESENT"), "rationale": "scripted"}
        for c in caps
    ]
    return json.dumps({"labels": labels})


class Scripted:
    """State of the scripted server. `script` holds one action per request, in arrival order (then `default`):
    ("text", answer) | ("status", code, body) | ("sleep", seconds, next_action) | callable(request) -> action."""

    def __init__(self):
        self.script: deque = deque()
        self.default: Callable[[dict[str, Any]], Any] = lambda req: ("text", labels_answer(req))
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""

    @property
    def count(self) -> int:
        return len(self.requests)


def _handler(state: Scripted):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, body: Any) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                pass

        def do_POST(self):  # noqa: N802 - http.server API
            n = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(n) or b"{}")
            with state.lock:
                # header names are case-insensitive (the SDK sends `authorization`): keep the parsed
                # headers object, whose `in` and `get` ignore case as a real server does
                state.requests.append({"path": self.path, "headers": self.headers, "json": req})
                action = state.script.popleft() if state.script else state.default
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                while True:
                    if callable(action):
                        action = action(req)
                    if action[0] == "sleep":
                        time.sleep(action[1])
                        action = action[2]
                        continue
                    break
                if action[0] == "text":
                    self._send(200, chat_response(action[1]))
                elif action[0] == "status":
                    self._send(action[1], action[2])
                else:  # raw 200 body
                    self._send(200, action[1])
            finally:
                with state.lock:
                    state.in_flight -= 1

    return H


@pytest.fixture
def llm_server():
    state = Scripted()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    state.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        yield state
    finally:
        srv.shutdown()
        srv.server_close()
