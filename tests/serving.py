"""A real `trace serve` process on a loopback port, for the tests of the `server` rollout engine, and a loopback
chat-completion endpoint that answers what a test says (imported by module name: tests/ is on sys.path)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_testing import BIN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    """(status, body: JSON when it parses, else text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


@dataclass
class Server:
    base: str  # http://127.0.0.1:PORT/v1
    proc: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def trace_serve(ref: str, store: Path, log: Path, *extra: str) -> Iterator[Server]:
    """`trace serve REF --enable-lora` on a free loopback port, until the block ends (Ctrl-C, then kill)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            str(BIN / "trace"),
            "serve",
            ref,
            "--port",
            str(port),
            "--store",
            str(store),
            "--enable-lora",
            *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),  # a file: a pipe nobody reads would fill with the per-request log lines
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"trace serve exited: {log.read_text()}")
            try:
                if http("GET", f"{base}/models", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"trace serve did not answer in 120 s: {log.read_text()}")
            time.sleep(0.3)
        yield Server(base, proc, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def chat_server(answer: Callable[[dict[str, Any]], str], model: str = "m") -> Iterator[str]:
    """A loopback OpenAI chat-completion endpoint whose assistant message is `answer(request body)`; yields its
    base URL (`http://127.0.0.1:PORT/v1`)."""
    import http.server
    import threading

    class Chat(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            msg = {"role": "assistant", "content": answer(body)}
            choice = {"index": 0, "message": msg, "finish_reason": "stop"}
            doc = {"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": [choice]}
            out = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}/v1"
    finally:
        srv.shutdown()
        srv.server_close()
