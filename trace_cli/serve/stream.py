"""A request's choices as the engine reports them: collected (non-streaming) or streamed as OpenAI's chunks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from trace_cli.models.toolcalls import PYTHON_TAG
from trace_cli.serve.completion import as_generated, to_completion
from trace_cli.serve.engine import Engine
from trace_cli.serve.job import Job
from trace_cli.serve.requests import error_body


async def watch_disconnect(request: Request, jobs: list[Job]) -> None:
    """Cancel the request's generation when its client disconnects (the body is read: the next message the
    server gets for this request is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            for j in jobs:
                j.cancel()
            return


class Run:
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
        return as_generated(text)

    async def sse(self, rid: str, created: int, model: str, state, *, usage: bool = False):
        """OpenAI's chunk stream: a role chunk, content as it is generated, tool calls (one delta each) and
        the finish reason when a choice ends, a usage chunk when `usage` (stream_options.include_usage),
        [DONE]. Cancelled when the client goes away. A reply that may be a tool call starts without
        `content: ""` (OpenAI's tool-call deltas carry none)."""

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
            body = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
            if usage:
                body["usage"] = None
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        sent = [""] * len(self.jobs)
        live = [True] * len(self.jobs)  # the content streamed so far is still a prefix of what it shows
        try:
            for i in range(len(self.jobs)):
                yield chunk(
                    i, {"role": "assistant"} if self.parse_tools else {"role": "assistant", "content": ""}
                )
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
            state.completion_tokens = sum(c.completion_tokens for c in self.done.values())
            if usage:
                yield f"data: {json.dumps(self._usage_chunk(rid, created, model))}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if len(self.done) < len(self.jobs):
                # the client went away (or the stream failed): stop generating
                state.status = getattr(state, "status", None) or 499
                state.completion_tokens = sum(len(j.ids) for j in self.jobs)
                for j in self.jobs:
                    j.cancel()

    def _usage_chunk(self, rid: str, created: int, model: str) -> dict[str, Any]:
        n_prompt = len(self.jobs[0].prompt_ids)
        n_comp = sum(c.completion_tokens for c in self.done.values())
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_comp,
            "total_tokens": n_prompt + n_comp,
            "prompt_tokens_details": {"cached_tokens": self.jobs[0].cached},
        }
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
