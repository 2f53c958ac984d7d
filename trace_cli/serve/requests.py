"""A chat-completions request as the server reads it: the body's schema (pydantic), the checks OpenAI makes
on a message sequence (with OpenAI's own error messages), and the messages in the form `trace eval` keeps."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16


class RequestError(Exception):
    """A request the server cannot take: HTTP 400 (or `status`) with an OpenAI-style error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_error(errs: list[dict[str, Any]]) -> RequestError:
    """pydantic's errors -> one 400. A body that is not JSON says so, with the decoder's reason (pydantic
    reports it at the character offset, which is no parameter)."""
    first = errs[0] if errs else {}
    if first.get("type") == "json_invalid":
        why = (first.get("ctx") or {}).get("error") or "invalid JSON"
        at = [x for x in first.get("loc", ()) if isinstance(x, int)]
        where = f" (at character {at[0]})" if at else ""
        return RequestError(
            f"We could not parse the JSON body of your request: {why}{where}. The OpenAI API expects a JSON "
            "payload, but what was sent was not valid JSON."
        )
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    msg = "; ".join(
        f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
        for e in errs[:5]
    )
    return RequestError(msg or "invalid request", param=".".join(loc) or None, code="invalid_request")


def check_response_format(req: ChatRequest) -> None:
    """`{"type": "text"}` is what the server does anyway; JSON modes are refused (not silently ignored)."""
    kind = (req.response_format or {}).get("type", "text")
    if kind != "text":
        raise RequestError(
            f"Invalid parameter: 'response_format' of type '{kind}' is not supported by this server "
            "(only 'text'; constrain the output with tools and tool_choice instead).",
            param="response_format",
            code="unsupported_parameter",
        )


def check_sequence(messages: list[Message]) -> None:
    """OpenAI's checks of the message order: user content is not null, every tool message answers a call of
    the assistant message before it (by `tool_call_id`), and every call of an assistant message is answered
    before the conversation goes on."""
    open_ids: list[str] | None = None  # the calls of the last assistant message still unanswered
    for i, m in enumerate(messages):
        if m.role == "tool":
            if open_ids is None:
                raise RequestError(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    param=f"messages.[{i}].role",
                )
            if m.tool_call_id is None:
                raise RequestError(
                    f"Missing required parameter: 'messages.[{i}].tool_call_id'.",
                    param=f"messages.[{i}].tool_call_id",
                    code="missing_required_parameter",
                )
            if m.tool_call_id not in open_ids:
                raise RequestError(
                    f"Invalid parameter: 'tool_call_id' of '{m.tool_call_id}' not found in 'tool_calls' of "
                    "previous message.",
                    param=f"messages.[{i}].tool_call_id",
                )
            open_ids.remove(m.tool_call_id)
            continue
        _unanswered(open_ids, i - 1)
        open_ids = (
            [str(tc.get("id")) for tc in m.tool_calls] if m.role == "assistant" and m.tool_calls else None
        )
        if m.role == "user" and m.content is None:
            raise RequestError(
                "Invalid value for 'content': expected a string, got null.", param=f"messages.[{i}].content"
            )
    _unanswered(open_ids, len(messages) - 1)


def _unanswered(open_ids: list[str] | None, i: int) -> None:
    if open_ids:
        raise RequestError(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(open_ids)}",
            param=f"messages.[{i}].role",
        )


def tools_for(req: ChatRequest) -> tuple[list[dict[str, Any]] | None, bool, list[str] | None]:
    """(tools rendered into the prompt, whether tool calls are parsed, the names a call is forced to) for the
    request's tool_choice: "none" offers no tools, "required" forces a call to one of them, a named function
    a call to it."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice
    if choice == "none":
        return None, False, None
    if choice not in (None, "auto") and not tools:
        raise RequestError("tool_choice is only allowed when tools are specified", param="tool_choice")
    if not tools:
        return None, False, None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise RequestError(
                "tool_choice: expected 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if not any(t["function"]["name"] == name for t in tools):
            raise RequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return tools, True, [name]
    if choice == "required":
        return tools, True, [t["function"]["name"] for t in tools]
    return tools, True, None


def too_long(ctx: int, prompt: int, asked: int) -> RequestError:
    return RequestError(
        f"This model's maximum context length is {ctx} tokens. However, you requested {prompt + asked} tokens "
        f"({prompt} in the messages, {asked} in the completion). Please reduce the length of the messages or "
        "completion.",
        param="messages",
        code="context_length_exceeded",
    )


def _text(content: Any, where: str) -> str | None:
    """OpenAI content: a string, null, or a list of parts of which the text ones are kept."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError(f"{where}: only text content parts are supported", param=where)
            parts.append(p["text"])
        return "".join(parts)
    raise RequestError(f"{where}: expected a string, null or a list of text parts", param=where)


def _internal_calls(calls: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    norm = []
    for k, tc in enumerate(calls):
        fn = tc.get("function") or {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):  # not JSON, a number too long, nested too deep
                pass  # rendered as the text it is
        if not isinstance(fn.get("name"), str):
            raise RequestError(
                f"messages[{i}].tool_calls[{k}].function.name is required", param=f"messages[{i}].tool_calls"
            )
        norm.append(
            {"id": tc.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}}
        )
    return norm


def to_internal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request messages -> the form eval keeps (tool-call arguments as objects), so the prompt a served model
    sees is byte-identical to the one it sees in `trace eval`."""
    out = []
    for i, m in enumerate(messages):
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), f"messages[{i}].content")}
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        if m.get("tool_calls"):
            msg["tool_calls"] = _internal_calls(m["tool_calls"], i)
        out.append(msg)
    return out
