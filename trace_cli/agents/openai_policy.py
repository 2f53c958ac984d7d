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
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trace_cli.agents.base import as_turn
from trace_cli.envs.rollout import EpisodeState, Turn
from trace_cli.errors import TraceError, UsageError, shown
from trace_cli.llm.openai_client import AnswerLimit, Endpoint, answer_limits, api_error, make_client


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


# Budgets over many answers, in answers' worth of the endpoint's max_answer_mb (every answer is kept in its
# episode's messages and stored): an episode's answers, and the run's.
EPISODE_ANSWERS = 2
RUN_ANSWERS = 32


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:  # an object that takes no weak reference: held
        return lambda: obj


class MalformedAnswer(ValueError):
    """A response that is not a chat completion of the expected shape (the message says what is wrong)."""


def _field(obj: Any, name: str) -> Any:
    """`obj.name` of an SDK object (or a dict's key): the SDK builds its objects without validation, so any
    field may hold anything the server sent."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # content parts
        if all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content):
            return "".join(p.get("text", "") for p in content)
    raise MalformedAnswer(f"`content` is {type(content).__name__}, not text")


def to_actions(message: Any) -> str | list[dict[str, Any]]:
    """A response message -> text (no tool calls: parsed as a local model's turn) or structured actions.
    MalformedAnswer when the message is not of a chat completion's shape; malformed `arguments` of a call
    (not a JSON object, nested too deep, a number too long) make a malformed action instead."""
    if message is None:
        raise MalformedAnswer("`message` is null")
    calls = _field(message, "tool_calls") or []
    content = _text(_field(message, "content"))
    if not calls:
        return content
    if not isinstance(calls, list):
        raise MalformedAnswer(f"`tool_calls` is {type(calls).__name__}, not a list")
    actions: list[dict[str, Any]] = []
    if content:
        actions.append({"content": content})
    for tc in calls:
        fn = _field(tc, "function")
        name, raw = _field(fn, "name"), _field(fn, "arguments") or ""
        if not isinstance(name, str) or not isinstance(raw, str):
            raise MalformedAnswer("a tool call without a function name and `arguments` text")
        try:
            args = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):  # not JSON, nested too deep, a number too long to convert
            args = None
        if not isinstance(args, dict):
            actions.append(
                {
                    "malformed": json.dumps({"name": name, "arguments": raw[:MAX_SHOWN]}, ensure_ascii=False),
                    "error": "`arguments` is not a JSON object",
                }
            )
        else:
            actions.append({"name": name, "arguments": args})
    return actions


MAX_SHOWN = 4096  # of malformed arguments kept in the episode


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
        self._lock = threading.Lock()
        self._run_bytes = 0  # answers' bytes over the policy's life (one run)
        self._episode_bytes: dict[int, list[Any]] = {}  # id(state) -> [weak reference to it, answers' bytes]

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
        where = f"{self.endpoint.base_url} (model {self.endpoint.model})"
        try:
            with answer_limits(self.endpoint) as budget:
                try:
                    resp = self.client.chat.completions.create(**kwargs)
                finally:
                    self._account(state, budget.received, where)
        except (Exception, AnswerLimit) as e:  # noqa: BLE001 - mapped to a clear message
            err = api_error(e, self.endpoint)
            if not isinstance(
                err, (TraceError, KeyboardInterrupt)
            ):  # the SDK could not read the answer (HTML, cut-off JSON)
                err = UsageError(f"{where}: malformed answer ({type(e).__name__}: {shown(e, limit=200)})")
            raise err from None
        try:
            choices = _field(resp, "choices")
            if not isinstance(choices, list):
                raise MalformedAnswer("no `choices` list (not a chat-completions response)")
            if not choices:
                return "", 0
            used = _field(_field(resp, "usage"), "completion_tokens")
            used = used if type(used) is int and 0 <= used < 1 << 40 else 0
            return to_actions(_field(choices[0], "message")), used
        except MalformedAnswer as e:
            raise UsageError(f"{where}: malformed answer: {e}") from None

    def _account(self, state: EpisodeState, n: int, where: str) -> None:
        """Count an answer's bytes against the episode's and the run's budgets (EPISODE_ANSWERS and RUN_ANSWERS
        answers' worth of the endpoint's max_answer_mb); UsageError past either."""
        cap = self.endpoint.max_answer_mb
        with self._lock:
            self._run_bytes += n
            entry = self._episode_bytes.get(id(state))
            if entry is None or entry[0]() is not state:  # a new episode (or a reused id)
                if len(self._episode_bytes) > 4096:  # drop the finished episodes'
                    self._episode_bytes = {k: v for k, v in self._episode_bytes.items() if v[0]() is not None}
                entry = self._episode_bytes[id(state)] = [_ref(state), 0]
            entry[1] += n
            ep = entry[1]
        for used, answers, what in (
            (ep, EPISODE_ANSWERS, "an episode's"),
            (self._run_bytes, RUN_ANSWERS, "the run's"),
        ):
            if used > answers * cap * (1 << 20):
                raise UsageError(
                    f"{where}: the answers exceed {what} budget ({answers * cap:g} MB: {answers} times "
                    f"max_answer_mb)",
                    hint="the endpoint floods the run; lower its max_new_tokens, or raise max_answer_mb in the "
                    "openai: reference if its answers are really this large",
                )

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
