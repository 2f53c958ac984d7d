"""The shared OpenAI SDK client: a low layer (only the SDK and trace_cli.errors), and its reply parsing."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import trace_cli.llm
from trace_cli.llm.openai_client import MalformedReply, Reply


def test_llm_imports_nothing_above_the_floor():
    """Analysts, envs and agents all import trace_cli.llm: it may import only trace_cli.errors of ours."""
    for path in Path(trace_cli.llm.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("trace_cli"):
                    assert name == "trace_cli.errors", f"{path.name} imports {name}"


def _body(message) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": message}]}).encode()


def test_reply_text():
    assert Reply(_body({"role": "assistant", "content": '{"a": 1}'}), 1).text() == '{"a": 1}'
    parts = {"role": "assistant", "content": [{"type": "text", "text": "{"}, {"type": "text", "text": "}"}]}
    assert Reply(_body(parts), 1).text() == "{}"
    for bad, why in (
        (b"<html>oops</html>", "not a chat-completions response"),
        (json.dumps({"choices": []}).encode(), "not a chat-completions response"),
        (_body({"role": "assistant", "content": "  "}), "no message text"),
        (_body({"role": "assistant", "content": None}), "no message text"),
    ):
        with pytest.raises(MalformedReply, match=why):
            Reply(bad, 1).text()
