"""Ctrl-C aborts every LLM answer of the process (llm.openai_client.abort, so that nothing waits on a server while
the CLI exits); a later invocation of the CLI in the same process starts unaborted (it used to raise
KeyboardInterrupt from its first answer, which ended a whole pytest run)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest


@pytest.fixture
def server():
    class Chat(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            msg = {"role": "assistant", "content": "Your order is cancelled."}
            out = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()


def test_a_later_invocation_is_not_aborted_by_an_earlier_ctrl_c(server, tmp_path, capsys):
    from trace_cli.cli import main
    from trace_cli.llm import openai_client

    openai_client.abort()  # what an earlier invocation's Ctrl-C leaves behind in this process
    with pytest.raises(SystemExit) as e:
        main(
            [
                "eval",
                "--model",
                f"openai:{server}?model=m",
                "--env",
                "shop",
                "--seeds",
                "0:2",
                "--store",
                str(tmp_path / "store"),
                "--json",
            ]
        )
    assert e.value.code in (0, None), capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["summary"]["episodes"] == 2
