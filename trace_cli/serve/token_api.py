"""vLLM's token-level API, as `trace serve` speaks it: `/v1/completions` with token-id prompts (and text ones),
per-token log-probabilities and the generated token ids (vLLM's `return_token_ids` and
`return_tokens_as_token_ids`), and run-time LoRA adapters (`/v1/load_lora_adapter`,
`/v1/unload_lora_adapter`; the adapter's model name is its `lora_name`). This is what the `server` rollout
engine (agents/engines.py) sends, so a run can switch between `trace serve --enable-lora` and
`vllm serve --enable-lora` by changing its URL.

Differences from vLLM kept on purpose: `n` > 1, `echo`, `best_of` and streaming are refused (HTTP 400), not
approximated; a prompt is never prefixed with a BOS token (token ids go in as sent, text is encoded without
special tokens, as `trace serve` renders chat prompts).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from trace_cli.serve.job import Job
from trace_cli.serve.requests import RequestError, too_long
from trace_cli.serve.stream import watch_disconnect

log = logging.getLogger("trace.serve")


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # other vLLM/OpenAI parameters are accepted and ignored
    model: str
    prompt: str | list[int] | list[list[int]] | list[str]
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # -1 or 0: off
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    skip_special_tokens: bool = True
    echo: bool = False
    stream: bool = False


class LoadLora(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLora(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str


def _prompts(engine, req: CompletionRequest) -> list[list[int]]:
    p = req.prompt
    if isinstance(p, str):
        return [engine.encode(p)]
    if not p:
        raise RequestError("prompt is empty", param="prompt")
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # type: ignore[arg-type]
    out = [engine.encode(x) if isinstance(x, str) else list(x) for x in p]
    if any(not x for x in out):
        raise RequestError("a prompt is empty", param="prompt")
    return out


def _check(engine, req: CompletionRequest, prompts: list[list[int]]) -> int:
    """The request's completion budget; a request this server does not take is a RequestError (HTTP 400)."""
    for flag, what in ((req.stream, "stream"), (req.echo, "echo"), (req.n != 1, "n")):
        if flag:
            raise RequestError(f"{what} is not supported on /v1/completions by trace serve", param=what)
    if req.temperature < 0 or not 0 < req.top_p <= 1:
        raise RequestError("temperature must be >= 0 and top_p in (0, 1]", param="temperature")
    if req.max_tokens is not None and req.max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    vocab = len(engine.tok)
    for p in prompts:
        if any(t < 0 or t >= vocab for t in p):
            raise RequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
    max_tokens = req.max_tokens or 16
    ctx = engine.max_context
    if ctx:
        longest = max(len(p) for p in prompts)
        if longest + max_tokens > ctx:
            raise too_long(ctx, longest, max_tokens)
    return max_tokens


def _choice(engine, req: CompletionRequest, i: int, prompt: list[int], job: Job) -> dict[str, Any]:
    ids = list(job.ids)
    text = engine.tok.decode(ids, skip_special_tokens=req.skip_special_tokens)
    if (
        job.stop
        and job.text is not None
        and job.finish == "stop"
        and (not ids or ids[-1] not in job.stop_ids)
    ):
        text = job.text  # cut at a stop string
    choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": job.finish, "logprobs": None}
    if req.logprobs is not None:
        if req.return_tokens_as_token_ids:
            toks = [f"token_id:{t}" for t in ids]
        else:
            toks = [engine.tok.decode([t], skip_special_tokens=False) for t in ids]
        offsets, at = [], 0
        for t in toks:
            offsets.append(at)
            at += len(t)
        choice["logprobs"] = {
            "tokens": toks,
            "token_logprobs": list(job.logprobs),
            "top_logprobs": [{t: lp} for t, lp in zip(toks, job.logprobs, strict=True)],
            "text_offset": offsets,
        }
    if req.return_token_ids:
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = list(prompt)
    return choice


async def completions(engine, req: CompletionRequest, request) -> dict[str, Any]:
    """POST /v1/completions: one job per prompt, answered when all are done."""
    state = request.state
    state.model = req.model
    adapter = engine.adapter_for(req.model)
    prompts = _prompts(engine, req)
    max_tokens = _check(engine, req, prompts)
    state.prompt_tokens = sum(len(p) for p in prompts)
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in prompts]
    stops = [s for s in ([req.stop] if isinstance(req.stop, str) else list(req.stop or [])) if s]
    top_k = req.top_k if req.top_k and req.top_k > 0 else 0
    jobs: list[Job] = []
    for i, p in enumerate(prompts):

        def emit(ev: tuple, fut=futs[i]) -> None:
            def put() -> None:
                if fut.done():
                    return
                if ev[0] == "done":
                    fut.set_result(ev)
                elif ev[0] == "error":
                    fut.set_exception(ev[1])

            if ev[0] in ("done", "error"):
                loop.call_soon_threadsafe(put)

        jobs.append(
            Job(
                p,
                max_tokens,
                emit,
                req.temperature,
                req.top_p,
                stops,
                seed=None if req.seed is None else req.seed + i,
                adapter=adapter,
                stop_ids=tuple(req.stop_token_ids or ()),
                top_k=top_k,
                want_logprobs=req.logprobs is not None,
            )
        )
    watch = asyncio.create_task(watch_disconnect(request, jobs))
    try:
        for j in jobs:
            engine.submit(j)
        await asyncio.gather(*futs)
    except BaseException:
        for j in jobs:
            j.cancel()
        raise
    finally:
        watch.cancel()
    choices = [_choice(engine, req, i, p, j) for i, (p, j) in enumerate(zip(prompts, jobs, strict=True))]
    completion_tokens = sum(len(j.ids) for j in jobs)
    state.completion_tokens = completion_tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": state.prompt_tokens + completion_tokens,
        },
    }


async def load_lora(engine, req: LoadLora, request) -> str:
    """POST /v1/load_lora_adapter (vLLM's body and plain-text answer)."""
    request.state.model = req.lora_name
    if req.load_inplace and req.lora_name in engine.loras:
        await engine.control("unload", req.lora_name)
    t0 = time.monotonic()
    await engine.control("load", req.lora_name, req.lora_path)
    log.info(
        "lora adapter loaded: %s from %s in %.0f ms (%d loaded)",
        req.lora_name,
        req.lora_path,
        (time.monotonic() - t0) * 1000,
        len(engine.loras),
    )
    return f"Success: LoRA adapter '{req.lora_name}' added successfully."


async def unload_lora(engine, req: UnloadLora, request) -> str:
    """POST /v1/unload_lora_adapter."""
    request.state.model = req.lora_name
    await engine.control("unload", req.lora_name)
    log.info("lora adapter unloaded: %s (%d loaded)", req.lora_name, len(engine.loras))
    return f"Success: LoRA adapter '{req.lora_name}' removed successfully."
