"""An OpenAI-compatible endpoint as a policy: `trace eval --model 'openai:http://HOST:PORT/v1?model=NAME'`.

Each round sends one chat-completions request per active episode, concurrently (the server batches them:
vLLM, or `trace serve`), through the official SDK with its retries and timeouts. Tool calls come from the
response's `tool_calls` as structured actions; a call whose `arguments` is not a JSON object is a malformed
action (answered with a tool error, as any other). A turn without tool calls is returned as text to the
Hermes parser (agents.base.text_turn), which strips end-of-turn markers and `<think>` blocks and treats an
unparsed `<tool_call>` block as a malformed call, exactly as for a local model — so a model served by
`trace serve` gives the same episodes as when it is evaluated directly.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trace_cli.agents.base import as_turn
from trace_cli.envs.rollout import EpisodeState, Turn
from trace_cli.llm.openai_client import Endpoint, api_error, make_client


def to_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored messages -> OpenAI request messages (arguments as JSON text; only the fields the API knows)."""
    out = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": m.get("tool_call_id") or "", "content": m.get("content")}
            )
            continue
        msg: dict[str, Any] = {"role": role, "content": m.get("content")}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": tc.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": tc["function"]["name"],
                        "arguments": a
                        if isinstance(a := tc["function"].get("arguments"), str)
                        else json.dumps(a),
                    },
                }
                for i, tc in enumerate(m["tool_calls"])
            ]
        out.append(msg)
    return out


def to_actions(message: Any) -> str | list[dict[str, Any]]:
    """A response message -> text (no tool calls: parsed as a local model's turn) or structured actions."""
    calls = getattr(message, "tool_calls", None) or []
    if not calls:
        return message.content or ""
    actions: list[dict[str, Any]] = []
    if message.content:
        actions.append({"content": message.content})
    for tc in calls:
        fn = tc.function
        raw = fn.arguments or ""
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            actions.append(
                {
                    "malformed": json.dumps({"name": fn.name, "arguments": raw}, ensure_ascii=False),
                    "error": "`arguments` is not a JSON object",
                }
            )
        else:
            actions.append({"name": fn.name, "arguments": args})
    return actions


class OpenAIPolicy:
    """Any OpenAI-compatible chat-completions endpoint, sampling as the stage's config says (its schema's
    defaults: greedy, temperature 0)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
        client: Any = None,
    ):
        self.endpoint = endpoint
        self.name = endpoint.display
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.client = client or make_client(endpoint)
        self._pool: ThreadPoolExecutor | None = None

    def _request(self, state: EpisodeState) -> tuple[str | list[dict[str, Any]], int]:
        kwargs: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": to_openai(state.messages),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_new_tokens,
        }
        if state.tools:
            kwargs["tools"] = state.tools
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except Exception as e:  # noqa: BLE001 - mapped to a clear message (or re-raised as it is)
            raise api_error(e, self.endpoint) from e
        if not resp.choices:
            return "", 0
        used = getattr(resp.usage, "completion_tokens", 0) or 0
        return to_actions(resp.choices[0].message), used

    def act(self, states: list[EpisodeState]) -> list[Turn]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.endpoint.concurrency, thread_name_prefix="openai"
            )
        out = []
        for s, (actions, used) in zip(states, self._pool.map(self._request, states), strict=True):
            s.gen_tokens += used
            out.append(as_turn(actions))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
