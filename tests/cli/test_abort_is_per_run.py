"""Ctrl-C aborts every LLM answer of the process (llm.openai_client.abort, so that nothing waits on a server while
the CLI exits); a later invocation of the CLI in the same process starts unaborted (it used to raise
KeyboardInterrupt from its first answer, which ended a whole pytest run)."""

from __future__ import annotations

import json

import pytest
from serving import chat_server  # noqa: E402


@pytest.fixture
def server():
    with chat_server(lambda body: "Your order is cancelled.") as url:
        yield url


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
