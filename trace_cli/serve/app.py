"""The OpenAI-compatible ASGI app (FastAPI): `/v1/models`, `/v1/chat/completions` (tools, tool_choice,
temperature, top_p, max_tokens, stop, n, seed, stream). Errors use OpenAI's body
`{"error": {"message", "type", "param", "code"}}`: a malformed request is HTTP 400 (a prompt that does not
fit the context with its max_tokens: code `context_length_exceeded`), a wrong key 401, an unknown model 404.
Parameters the server does not use (user, logprobs, ...) are accepted and ignored, as LiteLLM and other
clients send them. `tool_choice` "required" or a named function prefills the start of a call in the model
family's format (the model writes the arguments); "none" offers no tools. Streams send each token's text as
it is generated; a client that disconnects cancels its generation. One log line per request (logger
`trace.serve`). A router composition routes each request on its messages as eval does and names its
decision in the `x-trace-route` response header (JSON: skill -> weight)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from trace_cli.models.chat import strip_text
from trace_cli.models.toolcalls import PYTHON_TAG
from trace_cli.serve.engine import Engine, Job, RequestError, to_completion, to_internal

MAX_N = 16
ROUTE_HEADER = "x-trace-route"  # a router composition's decision for the request
log = logging.getLogger("trace.serve")


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


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _err(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = {401: "authentication_error", 404: "invalid_request_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _tools_for(req: ChatRequest) -> tuple[list[dict[str, Any]] | None, bool, list[str] | None]:
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


def _too_long(ctx: int, prompt: int, asked: int) -> RequestError:
    return RequestError(
        f"This model's maximum context length is {ctx} tokens. However, you requested {prompt + asked} tokens "
        f"({prompt} in the messages, {asked} in the completion). Please reduce the length of the messages or "
        "completion.",
        param="messages",
        code="context_length_exceeded",
    )


class _Gate:
    """ASGI middleware: the API key check and one log line per request (method, path, model, status,
    prompt/completion tokens, latency). Plain ASGI, so a client's disconnect reaches the endpoint."""

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        state = scope.setdefault("state", {})
        status = [0]

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            headers = dict(scope.get("headers") or [])
            if self.api_key and headers.get(b"authorization", b"").decode() != f"Bearer {self.api_key}":
                resp = _err(
                    401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key"
                )
                await resp(scope, receive, send_)
            else:
                await self.app(scope, receive, send_)
        finally:
            code = state.get("status") or status[0] or 500
            fields = [f"{scope.get('method')} {scope.get('path')}", f"status={code}"]
            if "model" in state:
                fields.append(f"model={state['model']}")
            for k in ("prompt_tokens", "completion_tokens"):
                if k in state:
                    fields.append(f"{k}={state[k]}")
            if state.get("stream"):
                fields.append("stream=true")
            fields.append(f"latency_ms={(time.monotonic() - t0) * 1000:.0f}")
            log.info(" ".join(fields))


def create_app(engine: Engine, *, api_key: str | None = None, default_max_tokens: int = 512) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await engine.stop()

    app = FastAPI(title="trace serve", lifespan=lifespan)
    app.add_middleware(_Gate, api_key=api_key)

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

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception):
        log.error("request failed: %s: %s", type(exc).__name__, exc)
        return _err(500, f"generation failed: {type(exc).__name__}: {exc}")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": engine.name, "object": "model", "created": 0, "owned_by": "trace"}],
        }

    @app.get("/stats")
    async def stats():
        """What the decode loop is doing now (rows running, requests waiting, tokens generated so far)."""
        return engine.stats()

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        state = request.state
        state.model = req.model
        if req.model != engine.name:
            raise RequestError(
                f"model {req.model!r} is not served here; this server serves {engine.name!r}",
                param="model",
                code="model_not_found",
                status=404,
            )
        tools, parse_tools, forced_names = _tools_for(req)
        messages = to_internal([m.model_dump(exclude_none=True) for m in req.messages])
        prompt = engine.render(messages, tools)
        prompt_ids = engine.encode(prompt)
        asked = req.max_completion_tokens or req.max_tokens
        max_tokens = asked or default_max_tokens
        ctx = engine.max_context
        if ctx:
            if len(prompt_ids) + (asked or 1) > ctx:
                raise _too_long(ctx, len(prompt_ids), asked or 1)
            max_tokens = min(max_tokens, ctx - len(prompt_ids))  # no max_tokens asked: what fits
        forced = engine.forced_ids(prompt, prompt_ids, forced_names) if forced_names else None
        stop = [s for s in ([req.stop] if isinstance(req.stop, str) else list(req.stop or [])) if s]
        state.prompt_tokens, state.stream = len(prompt_ids), req.stream
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, tuple]] = asyncio.Queue()
        jobs: list[Job] = []
        for i in range(req.n):

            def emit(ev: tuple, i: int = i) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (i, ev))

            jobs.append(
                Job(
                    prompt_ids,
                    max_tokens,
                    emit,
                    req.temperature,
                    req.top_p,
                    stop,
                    forced,
                    messages,
                    seed=None if req.seed is None else req.seed + i,
                )
            )
        run = _Run(engine, jobs, events, parse_tools, forced_names, stop)
        watch = asyncio.create_task(_watch_disconnect(request, jobs))
        try:
            for j in jobs:
                engine.submit(j)
            route = await run.started()  # a router's decision (x-trace-route) comes before any token
            headers = {ROUTE_HEADER: json.dumps(route, sort_keys=True)} if route is not None else None
            rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            if req.stream:
                watch.cancel()  # Starlette's StreamingResponse watches the client from here on
                return StreamingResponse(
                    run.sse(rid, created, engine.name, state),
                    media_type="text/event-stream",
                    headers=headers,
                )
            choices = await run.finished()
        except BaseException:
            for j in jobs:
                j.cancel()
            raise
        finally:
            if not req.stream:
                watch.cancel()
        if choices is None:  # the client went away; nobody reads this
            state.status = 499
            state.completion_tokens = sum(len(j.ids) for j in jobs)
            return JSONResponse(error_body("client closed the request", "invalid_request_error"), 499)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": sum(c.completion_tokens for c in choices),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        state.completion_tokens = usage["completion_tokens"]
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


async def _watch_disconnect(request: Request, jobs: list[Job]) -> None:
    """Cancel the request's generation when its client disconnects (the body is read: the next message the
    server gets for this request is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            for j in jobs:
                j.cancel()
            return


class _Run:
    """A request's choices as the engine reports them: collected (non-streaming) or streamed as chunks."""

    def __init__(self, engine: Engine, jobs, events, parse_tools: bool, forced: list[str] | None, stop):
        self.engine, self.jobs, self.events = engine, jobs, events
        self.parse_tools, self.forced, self.stop = parse_tools, forced, stop
        self.pending: list[tuple[int, tuple]] = []
        self.done: dict[int, Any] = {}
        self.route: Any = None

    async def started(self) -> Any:
        """Wait for the first choice to be admitted (its routing decision)."""
        while True:
            i, ev = await self.events.get()
            self.pending.append((i, ev))
            if ev[0] == "error":
                raise ev[1]
            if ev[0] in ("start", "done") and i == 0:
                return ev[1] if ev[0] == "start" else None

    async def _next(self) -> tuple[int, tuple]:
        if self.pending:
            return self.pending.pop(0)
        return await self.events.get()

    def _completion(self, i: int, ev: tuple):
        _, text, ids, finish = ev
        return to_completion(
            text,
            ids,
            index=i,
            parse_tools=self.parse_tools,
            parse=self.engine.parse,
            finish=finish,
            forced=self.forced,
        )

    async def finished(self):
        """Every choice, or None when the client went away first."""
        while len(self.done) < len(self.jobs):
            if all(j.cancelled for j in self.jobs):
                return None
            try:
                i, ev = await asyncio.wait_for(self._next(), 0.5)
            except TimeoutError:
                continue
            if ev[0] == "error":
                raise ev[1]
            if ev[0] == "done":
                self.done[i] = self._completion(i, ev)
        return [self.done[i] for i in range(len(self.jobs))]

    def _visible(self, text: str) -> str:
        """The part of a partial completion that is content for sure (streamed now): not a tool call that
        may be starting, nor the start of a stop string or of a `<think>` block."""
        if self.forced:
            return ""
        text = text.rstrip("\ufffd")  # a character whose bytes are not all generated yet
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    text = text[:-k]
                    break
        if "<think>" in text and "</think>" not in text[text.rfind("<think>") :]:
            text = text[: text.rfind("<think>")]
        if self.parse_tools:
            fmt = self.engine.tool_format
            marker = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}.get(fmt)
            if marker:
                at = text.find(marker)
                if at >= 0:
                    text = text[:at]
                else:
                    for k in range(min(len(marker) - 1, len(text)), 0, -1):
                        if text.endswith(marker[:k]):
                            text = text[:-k]
                            break
            elif text.lstrip().startswith(("{", "[")) or PYTHON_TAG in text:
                return ""
        return strip_text(text)

    async def sse(self, rid: str, created: int, model: str, state):
        """OpenAI's chunk stream: a role chunk, content as it is generated, tool calls (one delta each) and
        the finish reason when a choice ends, a usage chunk, [DONE]. Cancelled when the client goes away."""

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
            body = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        sent = [""] * len(self.jobs)
        live = [True] * len(self.jobs)  # the content streamed so far is still a prefix of what it shows
        try:
            for i in range(len(self.jobs)):
                yield chunk(i, {"role": "assistant", "content": ""})
            while len(self.done) < len(self.jobs):
                i, ev = await self._next()
                if ev[0] == "error":
                    state.status = 500
                    yield f"data: {json.dumps(error_body(str(ev[1]), 'server_error'))}\n\n"
                    return
                if ev[0] == "text" and live[i]:
                    vis = self._visible(ev[1])
                    if vis.startswith(sent[i]):
                        if len(vis) > len(sent[i]):
                            yield chunk(i, {"content": vis[len(sent[i]) :]})
                            sent[i] = vis
                    else:
                        live[i] = False
                elif ev[0] == "done":
                    c = self.done[i] = self._completion(i, ev)
                    if c.content and c.content.startswith(sent[i]) and len(c.content) > len(sent[i]):
                        yield chunk(i, {"content": c.content[len(sent[i]) :]})
                    for k, tc in enumerate(c.tool_calls):
                        yield chunk(i, {"tool_calls": [{"index": k, **tc}]})
                    yield chunk(i, {}, c.finish_reason)
            n_prompt = len(self.jobs[0].prompt_ids)
            n_comp = sum(c.completion_tokens for c in self.done.values())
            state.completion_tokens = n_comp
            usage = {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_comp,
                "total_tokens": n_prompt + n_comp,
            }
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
        finally:
            if len(self.done) < len(self.jobs):
                # the client went away (or the stream failed): stop generating
                state.status = getattr(state, "status", None) or 499
                state.completion_tokens = sum(len(j.ids) for j in self.jobs)
                for j in self.jobs:
                    j.cancel()
