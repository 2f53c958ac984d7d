"""Helpers shared by the serve tests (imported by module name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call_exchange(cid: str, fn: str, arguments: Any, result: str, **tool_fields: Any) -> list[dict[str, Any]]:
    """An assistant message calling `fn` (id `cid`) and the tool message answering it."""
    call = {"id": cid, "type": "function", "function": {"name": fn, "arguments": arguments}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": cid, **tool_fields, "content": result},
    ]
