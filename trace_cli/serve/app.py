"""The OpenAI-compatible ASGI app (FastAPI): `/v1/models`, `/v1/chat/completions` (tools, tool_choice,
temperature, top_p, max_tokens, stop, n, stream). Errors use OpenAI's body
`{"error": {"message", "type", "param", "code"}}`: a malformed request is HTTP 400, a wrong key 401, an
unknown model 404. Parameters the server does not use (seed, user, logprobs, ...) are accepted and ignored,
as LiteLLM and other clients send them. A router composition routes each request on its messages as eval
does and names its decision in the `x-trace-route` response header (JSON: skill -> weight)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from trace_cli.serve.engine import Engine, RequestError, to_completion, to_internal

MAX_N = 16
ROUTE_HEADER = "x-trace-route"  # a router composition's decision for the request


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
    stream: bool = False


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _err(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = {401: "authentication_error", 404: "invalid_request_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _tools_for(req: ChatRequest) -> tuple[list[dict[str, Any]] | None, bool]:
    """(tools rendered into the prompt, whether tool calls are parsed) for the request's tool_choice."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice
    if choice == "none" or not tools:
        return None, False
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise RequestError(
                "tool_choice: expected 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise RequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return chosen, True  # only that tool is offered ("required" is not enforced: the model decides)
    return tools, True


def create_app(engine: Engine, *, api_key: str | None = None, default_max_tokens: int = 512) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await engine.stop()

    app = FastAPI(title="trace serve", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = "; ".join(
            f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
            for e in errs[:5]
        )
        return _err(400, msg or "invalid request", ".".join(loc) or None, "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _err(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError):
        return _err(exc.status, exc.message, exc.param, exc.code)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return _err(
                401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key"
            )
        return await call_next(request)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": engine.name, "object": "model", "created": 0, "owned_by": "trace"}],
        }

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if req.model != engine.name:
            raise RequestError(
                f"model {req.model!r} is not served here; this server serves {engine.name!r}",
                param="model",
                code="model_not_found",
                status=404,
            )
        tools, parse_tools = _tools_for(req)
        messages = to_internal([m.model_dump(exclude_none=True) for m in req.messages])
        prompt = engine.render(messages, tools)
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        key = (req.temperature, req.top_p, max_tokens)
        outs = await asyncio.gather(*(engine.generate(prompt, key, messages) for _ in range(req.n)))
        choices = [
            to_completion(
                text,
                ids,
                index=i,
                max_tokens=max_tokens,
                parse_tools=parse_tools,
                stop=stop,
                eos_id=engine.eos_id,
                parse=engine.parse,
            )
            for i, (text, ids, _, _) in enumerate(outs)
        ]
        usage = {
            "prompt_tokens": len(outs[0][2]),
            "completion_tokens": sum(c.completion_tokens for c in choices),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        route = outs[0][3]
        headers = {ROUTE_HEADER: json.dumps(route, sort_keys=True)} if route is not None else None
        if req.stream:
            return StreamingResponse(
                _sse(rid, created, engine.name, choices, usage),
                media_type="text/event-stream",
                headers=headers,
            )
        body = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": engine.name,
            "choices": [
                {
                    "index": c.index,
                    "message": {
                        "role": "assistant",
                        "content": c.content,
                        **({"tool_calls": c.tool_calls} if c.tool_calls else {}),
                    },
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
                for c in choices
            ],
            "usage": usage,
        }
        return JSONResponse(body, headers=headers)

    return app


def _sse(rid: str, created: int, model: str, choices, usage):
    """OpenAI's chunk stream for finished choices: role, content, tool calls (one delta each), finish, [DONE]."""

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    for c in choices:
        yield chunk(c.index, {"role": "assistant", "content": ""})
        if c.content:
            yield chunk(c.index, {"content": c.content})
        for k, tc in enumerate(c.tool_calls):
            yield chunk(c.index, {"tool_calls": [{"index": k, **tc}]})
        yield chunk(c.index, {}, c.finish_reason)
    final = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    yield f"data: {json.dumps(final)}\n\n"
    yield "data: [DONE]\n\n"
