"""What `trace serve` runs behind HTTP: OpenAI messages -> the model's own prompt, batched generation, and
the completion parsed with the model's tool-call parser into OpenAI `tool_calls`.

Concurrent requests are batched: a request waits up to `window_s` for others, and those with the same
sampling settings share one `generate` call (left-padded, as in eval). Generation runs on one worker
thread, so the event loop keeps accepting requests meanwhile. A policy that routes conversations (a router
composition) gets each request's messages with its prompt, so it decides as it does in eval; its decision
comes back with the completion.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trace_cli.models.chat import TOOL_CALL_RE, cut_at_end, parse_assistant, render, strip_text


class RequestError(Exception):
    """A request the server cannot take: HTTP 400 (or `status`) with an OpenAI-style error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


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


def to_internal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request messages -> the form eval keeps (tool-call arguments as objects), so the prompt a served model
    sees is byte-identical to the one it sees in `trace eval`."""
    out = []
    for i, m in enumerate(messages):
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), f"messages[{i}].content")}
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        calls = m.get("tool_calls") or []
        if calls:
            norm = []
            for k, tc in enumerate(calls):
                fn = tc.get("function") or {}
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        pass  # rendered as the text it is
                if not isinstance(fn.get("name"), str):
                    raise RequestError(
                        f"messages[{i}].tool_calls[{k}].function.name is required",
                        param=f"messages[{i}].tool_calls",
                    )
                norm.append(
                    {
                        "id": tc.get("id"),
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": args},
                    }
                )
            msg["tool_calls"] = norm
        out.append(msg)
    return out


@dataclass
class Completion:
    index: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    completion_tokens: int


@dataclass
class Job:
    prompt: str
    key: tuple  # (temperature, top_p, max_tokens): jobs with equal keys share a generate call
    future: asyncio.Future = field(repr=False)
    messages: list[dict[str, Any]] | None = None  # the conversation (internal form) the prompt renders


def to_completion(
    text: str,
    ids: list[int],
    *,
    index: int,
    max_tokens: int,
    parse_tools: bool,
    stop: list[str],
    eos_id: int | list[int],
    parse=None,
) -> Completion:
    """A generated turn -> an OpenAI choice. Parsed as `trace eval` parses it: valid calls become `tool_calls`
    (content = the text around them); a turn with a call that does not parse is returned as its raw text, so
    a client that parses it (the eval loop does) sees the same malformed call."""
    stops = set(eos_id) if isinstance(eos_id, list) else {eos_id}
    finish = "stop" if stops & set(ids) or len(ids) < max_tokens else "length"
    calls: list[dict[str, Any]] = []
    # the model family's parser (HFPolicy.parse); Hermes `<tool_call>` by default
    actions = (parse or parse_assistant)(text) if parse_tools else [{"content": strip_text(text)}]
    if any("name" in a or "malformed" in a for a in actions):
        if any("malformed" in a for a in actions):
            content: str | None = cut_at_end(text)
        else:
            said = next((a["content"] for a in actions if "content" in a), None)
            content = said if said is not None else TOOL_CALL_RE.sub("", strip_text(text)).strip()
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": a["name"],
                        "arguments": json.dumps(a["arguments"], ensure_ascii=False),
                    },
                }
                for a in actions
            ]
            finish = "tool_calls"
    else:
        content = strip_text(text)
    if stop and content and not calls:
        cuts = [content.find(s) for s in stop if s and s in content]
        if cuts:
            content, finish = content[: min(cuts)], "stop"
    return Completion(index, content, calls, finish, len(ids))


class Engine:
    """A loaded HF policy (`HFPolicy.generate`) behind an asyncio batching queue."""

    def __init__(self, policy, name: str, *, window_s: float = 0.005, max_batch: int = 32):
        self.policy = policy
        self.name = name
        self.window_s = window_s
        self.max_batch = max_batch
        self.eos_id = list(policy.eos)  # every stop token of the model (tokenizer + generation config)
        self.parse = getattr(policy, "parse", None)
        # a router composition routes each conversation on its messages (compose.policy.RouterPolicy)
        self.routes = hasattr(policy, "last_routes")
        self._queue: asyncio.Queue[Job] | None = None
        self._task: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self.batches: list[int] = []  # sizes of the generate calls made (for tests and the benchmark)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render(self.policy.tok, messages, tools, add_generation_prompt=True)

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def generate(
        self, prompt: str, key: tuple, messages: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int], list[int], dict[str, float] | None]:
        """(text, completion ids, prompt ids, routing decision or None) for one rendered prompt."""
        assert self._queue is not None, "Engine.start() first"
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put(Job(prompt, key, fut, messages))
        return await fut

    def _generate(self, jobs: list[Job], temperature, top_p, max_tokens) -> list[tuple]:
        """One batched generate call (on the worker thread, which also reads the router's decisions)."""
        kw: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_tokens}
        prompts = [j.prompt for j in jobs]
        if not self.routes:
            return [(*out, None) for out in self.policy.generate(prompts, **kw)]
        outs = self.policy.generate(prompts, conversations=[j.messages or [] for j in jobs], **kw)
        return [(*out, route) for out, route in zip(outs, self.policy.last_routes, strict=True)]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.window_s
            while len(batch) < self.max_batch:
                left = deadline - loop.time()
                try:
                    batch.append(
                        self._queue.get_nowait()
                        if left <= 0
                        else await asyncio.wait_for(self._queue.get(), left)
                    )
                except (TimeoutError, asyncio.QueueEmpty):
                    break
            groups: dict[tuple, list[Job]] = {}
            for job in batch:
                groups.setdefault(job.key, []).append(job)
            for key, jobs in groups.items():
                jobs = [j for j in jobs if not j.future.done()]  # a client that went away
                if not jobs:
                    continue
                temperature, top_p, max_tokens = key
                self.batches.append(len(jobs))
                try:
                    outs = await loop.run_in_executor(
                        self._pool, self._generate, jobs, temperature, top_p, max_tokens
                    )
                except Exception as e:  # noqa: BLE001 - every waiting request gets the error (HTTP 500)
                    for j in jobs:
                        if not j.future.done():
                            j.future.set_exception(e)
                    continue
                for j, out in zip(jobs, outs, strict=True):
                    if not j.future.done():
                        j.future.set_result(out)
