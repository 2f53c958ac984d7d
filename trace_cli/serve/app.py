"""The OpenAI-compatible ASGI app (FastAPI): `/v1/models`, `/v1/chat/completions` (tools, tool_choice,
temperature, top_p, max_tokens, stop, n, seed, stream). Errors use OpenAI's body
`{"error": {"message", "type", "param", "code"}}`: a malformed request is HTTP 400 (a prompt that does not
fit the context with its max_tokens: code `context_length_exceeded`), a wrong key 401, an unknown model 404.
Parameters the server does not use (user, logprobs, ...) are accepted and ignored, as LiteLLM and other
clients send them; `response_format` JSON modes are refused (400), not ignored. Message sequences OpenAI
refuses get its 400s (serve.requests). `tool_choice` "required" or a named function prefills the start of a call in the model
family's format (the model writes the arguments); "none" offers no tools. Streams send each token's text as
it is generated; a client that disconnects cancels its generation. One log line per request (logger
`trace.serve`). A router composition routes each request on its messages as eval does and names its
decision in the `x-trace-route` response header (JSON: skill -> weight).

vLLM's token-level API is served too (serve.token_api): `/v1/completions` with token-id prompts, per-token
log-probabilities and token ids, and with `--enable-lora` LoRA adapters loaded and unloaded at run time
(`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), each served under its `lora_name`."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trace_cli.errors import shown
from trace_cli.serve import token_api
from trace_cli.serve.engine import Engine
from trace_cli.serve.job import Job
from trace_cli.serve.requests import (
    ChatRequest,
    RequestError,
    check_response_format,
    check_sequence,
    error_body,
    to_internal,
    too_long,
    tools_for,
    validation_error,
)
from trace_cli.serve.stream import Run, watch_disconnect

ROUTE_HEADER = "x-trace-route"  # a router composition's decision for the request
log = logging.getLogger("trace.serve")


def _err(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = {401: "authentication_error", 404: "invalid_request_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


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
            # bytes against bytes: a header that is not UTF-8 is a wrong key (401), not a server error
            if self.api_key and not hmac.compare_digest(
                headers.get(b"authorization", b""), f"Bearer {self.api_key}".encode()
            ):
                resp = _err(
                    401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key"
                )
                await resp(scope, receive, send_)
            else:
                await self.app(scope, receive, send_)
        finally:
            code = state.get("status") or status[0] or 500
            # the path and model are the client's: escaped, so a log line cannot carry terminal controls
            fields = [f"{shown(scope.get('method'))} {shown(scope.get('path'))}", f"status={code}"]
            if "model" in state:
                fields.append(f"model={shown(state['model'])}")
            for k in ("prompt_tokens", "completion_tokens"):
                if k in state:
                    fields.append(f"{k}={state[k]}")
            if state.get("stream"):
                fields.append("stream=true")
            fields.append(f"latency_ms={(time.monotonic() - t0) * 1000:.0f}")
            log.info(" ".join(fields))


@dataclass(frozen=True)
class Served:
    """What every request is served with: the engine and the completion budget when a request asks none."""

    engine: Engine
    default_max_tokens: int


@dataclass(frozen=True)
class Prompt:
    """A checked request, rendered: its messages and prompt tokens, the completion budget, stops, tool parsing."""

    messages: list[dict[str, Any]]
    ids: list[int]
    max_tokens: int
    forced: Any
    stop: list[str]
    parse_tools: Any
    forced_names: Any


def prepare(served: Served, req: ChatRequest) -> Prompt:
    """Check the request (model, response_format, message sequence, context) and render its prompt."""
    engine = served.engine
    engine.adapter_for(req.model)  # the base model or a loaded LoRA adapter; else HTTP 404
    check_response_format(req)
    check_sequence(req.messages)
    tools, parse_tools, forced_names = tools_for(req)
    messages = to_internal([m.model_dump(exclude_none=True) for m in req.messages])
    prompt = engine.render(messages, tools)
    prompt_ids = engine.encode(prompt)
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = asked or served.default_max_tokens
    ctx = engine.max_context
    if ctx:
        if len(prompt_ids) + (asked or 1) > ctx:
            raise too_long(ctx, len(prompt_ids), asked or 1)
        max_tokens = min(max_tokens, ctx - len(prompt_ids))  # no max_tokens asked: what fits
    forced = engine.forced_ids(prompt, prompt_ids, forced_names) if forced_names else None
    stop = [s for s in ([req.stop] if isinstance(req.stop, str) else list(req.stop or [])) if s]
    return Prompt(messages, prompt_ids, max_tokens, forced, stop, parse_tools, forced_names)


def make_jobs(engine: Engine, req: ChatRequest, prompt: Prompt, events: asyncio.Queue) -> list[Job]:
    """One generation job per choice (`n`); each reports its events to `events`, tagged with its index."""
    loop = asyncio.get_running_loop()
    jobs: list[Job] = []
    for i in range(req.n):

        def emit(ev: tuple, i: int = i) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (i, ev))

        jobs.append(
            Job(
                prompt.ids,
                prompt.max_tokens,
                emit,
                req.temperature,
                req.top_p,
                prompt.stop,
                prompt.forced,
                prompt.messages,
                seed=None if req.seed is None else req.seed + i,
                adapter=engine.adapter_for(req.model),
            )
        )
    return jobs


def completion_body(
    rid: str, created: int, model: str, choices: list, prompt: Prompt, jobs: list[Job]
) -> dict:
    """The chat.completion response of finished choices, with its usage (cached tokens: the prefix cache's)."""
    usage = {
        "prompt_tokens": len(prompt.ids),
        "completion_tokens": sum(c.completion_tokens for c in choices),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = {"cached_tokens": jobs[0].cached}  # served from the prefix cache
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
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


async def chat(served: Served, req: ChatRequest, request: Request):
    """POST /v1/chat/completions: submit one job per choice, then stream them or answer when all finished."""
    engine, state = served.engine, request.state
    state.model = req.model
    prompt = prepare(served, req)
    state.prompt_tokens, state.stream = len(prompt.ids), req.stream
    events: asyncio.Queue[tuple[int, tuple]] = asyncio.Queue()
    jobs = make_jobs(engine, req, prompt, events)
    run = Run(engine, jobs, events, prompt.parse_tools, prompt.forced_names, prompt.stop)
    watch = asyncio.create_task(watch_disconnect(request, jobs))
    try:
        for j in jobs:
            engine.submit(j)
        route = await run.started()  # a router's decision (x-trace-route) comes before any token
        headers = {ROUTE_HEADER: json.dumps(route, sort_keys=True)} if route is not None else None
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            watch.cancel()  # Starlette's StreamingResponse watches the client from here on
            return StreamingResponse(
                run.sse(rid, created, req.model, state, usage=req.include_usage()),
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
    body = completion_body(rid, created, req.model, choices, prompt, jobs)
    state.completion_tokens = body["usage"]["completion_tokens"]
    return JSONResponse(body, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    """OpenAI's error body for every failure: validation 400, HTTP errors, RequestError, anything else 500."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        e = validation_error(list(exc.errors()))
        return _err(400, e.message, e.param, e.code)

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


def create_app(engine: Engine, *, api_key: str | None = None, default_max_tokens: int = 512) -> FastAPI:
    served = Served(engine, default_max_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await engine.stop()

    app = FastAPI(title="trace serve", lifespan=lifespan)
    app.add_middleware(_Gate, api_key=api_key)
    add_error_handlers(app)

    @app.get("/v1/models")
    async def models():
        base = {"id": engine.name, "object": "model", "created": 0, "owned_by": "trace"}
        loras = [
            {"id": n, "object": "model", "created": 0, "owned_by": "trace", "root": p, "parent": engine.name}
            for n, p in engine.loras.items()
        ]
        return {"object": "list", "data": [base, *loras]}

    @app.post("/v1/completions")
    async def completions(req: token_api.CompletionRequest, request: Request):
        return JSONResponse(await token_api.completions(engine, req, request))

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: token_api.LoadLora, request: Request):
        return PlainTextResponse(await token_api.load_lora(engine, req, request))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: token_api.UnloadLora, request: Request):
        return PlainTextResponse(await token_api.unload_lora(engine, req, request))

    @app.get("/stats")
    async def stats():
        """What the decode loop is doing now (rows running, requests waiting, tokens generated so far)."""
        return engine.stats()

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        return await chat(served, req, request)

    return app
