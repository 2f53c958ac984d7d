"""The `openai` analyst: any OpenAI-compatible chat-completions server (vLLM, llama.cpp, SGLang, OpenAI, …).

One request per episode per labelling run (plus one for discovery), `response_format={"type": "json_object"}`,
answers validated against the schemas in `prompts.py`. Requests go through `trace_cli.llm.openai_client` (the
official SDK): the SDK retries timeouts, connection errors and HTTP 408/409/429/5xx with exponential backoff;
invalid answers are asked again with another seed. Both draw on one budget of `llm.max_retries` retries per
request; an episode that still fails gets ERROR labels (the stage leaves them out of the counts). A server
that was never reachable, and other 4xx answers (bad key, unknown model), stop the stage with a UsageError
(exit 2). The API key is read from the environment variable named by `llm.api_key_env` and is never logged
or stored; without it no Authorization header is sent (local servers need none).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TypeVar
from urllib.parse import urlparse

from trace_cli.analysts.base import Candidate, Label, Trajectory
from trace_cli.analysts.cache import ResponseCache, request_key
from trace_cli.analysts.prompts import (
    AnalystResponseError,
    PromptLimits,
    discovery_messages,
    labelling_messages,
    parse_discovery,
    parse_labels,
    to_labels,
)
from trace_cli.errors import UsageError
from trace_cli.llm.openai_client import ChatClient, Endpoint, MalformedReply, Unavailable
from trace_cli.progress import Bar

T = TypeVar("T")

DEFAULTS: dict[str, Any] = {
    "api_key_env": "OPENAI_API_KEY",
    "temperature": 0.7,
    "max_tokens": 1024,
    "timeout_s": 60.0,
    "max_retries": 4,
    "concurrency": 8,
    "cache": True,
}
SEED_STRIDE = 1_000_003  # a re-ask sends seed + k * stride so a seeded server does not repeat itself


class OpenAIAnalyst:
    name = "openai"
    deterministic = False

    def __init__(self, config: dict[str, Any], store: Any = None):
        llm = {**DEFAULTS, **{k: v for k, v in (config.get("llm") or {}).items() if v is not None}}
        if not llm.get("base_url") or not llm.get("model"):
            raise UsageError(
                "the openai analyst needs llm.base_url and llm.model "
                "(e.g. --base-url http://127.0.0.1:8000/v1 --llm-model NAME)"
            )
        self.base_url = str(llm["base_url"]).rstrip("/")
        parsed = urlparse(f"{self.base_url}/chat/completions")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(
                f"llm.base_url {llm['base_url']!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)"
            )
        self.path = parsed.path
        self.model = str(llm["model"])
        self.api_key_env = str(llm["api_key_env"])
        self.temperature = float(llm["temperature"])
        self.max_tokens = int(llm["max_tokens"])
        self.max_retries = int(llm["max_retries"])
        self.concurrency = int(llm["concurrency"])
        self.limits = PromptLimits.from_config(llm)
        self.cache = ResponseCache.for_store(store, self.name, bool(llm["cache"]))
        ep = Endpoint(
            base_url=self.base_url,
            model=self.model,
            api_key_env=self.api_key_env,
            timeout=float(llm["timeout_s"]),
            max_retries=self.max_retries,
            concurrency=self.concurrency,
        )
        self.chat = ChatClient(
            ep,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            json_mode=True,
            what="the analyst server",
            hints={
                401: f"set a valid key in ${self.api_key_env} (--api-key-env names the variable)",
                403: f"the key in ${self.api_key_env} is not allowed to use this model",
                404: "check --base-url (it usually ends in /v1) and --llm-model (the server's model name)",
            },
        )
        self._ever_answered = False

    def _ask(
        self, messages: list[dict[str, str]], *, run: int, seed: int, parse: Callable[[str], T]
    ) -> tuple[T | None, str | None]:
        """(parsed answer, None) or (None, why it failed after every retry). The cache is consulted first."""
        request = {
            "analyst": self.name,
            "path": self.path,
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
            "run": run,
        }
        key = request_key(request)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                try:
                    return parse(hit["text"]), None
                except AnalystResponseError:
                    pass  # e.g. stored under older parsing rules: ask again
        why = "no attempt made"
        unreachable = False
        budget = self.max_retries + 1  # HTTP requests this answer may take, the SDK's retries included
        k = 0
        while budget > 0:
            try:
                reply = self.chat.complete(messages, seed=seed + k * SEED_STRIDE, max_retries=budget - 1)
            except Unavailable as e:  # the SDK spent the budget
                why, unreachable = str(e), e.unreachable
                break
            self._ever_answered = True
            budget -= reply.attempts
            k += 1
            try:
                text = reply.text()
                value = parse(text)
            except (MalformedReply, AnalystResponseError) as e:
                why = f"invalid answer: {e}"
                continue
            if self.cache is not None:
                self.cache.put(key, request, text)
            return value, None
        if unreachable and not self._ever_answered:
            raise UsageError(
                f"the openai analyst cannot reach {self.base_url} ({why}) after "
                f"{self.max_retries + 1} attempts",
                hint="is the server running? check --base-url",
            )
        return None, f"analyst failed after {self.max_retries + 1} attempt(s): {why}"

    # ------------------------------------------------------------------------------------------ analyst API

    def discover(self, episodes: list[dict[str, Any]], max_candidates: int, seed: int) -> list[Candidate]:
        trajs = [Trajectory.from_episode(e) for e in episodes]
        msgs = discovery_messages(trajs, max_candidates, self.limits)
        ids = {t.task_id for t in trajs}
        cands, why = self._ask(
            msgs, run=-1, seed=seed, parse=lambda s: parse_discovery(s, max_candidates, ids)
        )
        if not cands:
            raise UsageError(
                f"capability discovery failed: {why}",
                hint="use --candidates catalog, or a stronger analyst model",
            )
        return cands

    def label(
        self, episodes: list[dict[str, Any]], candidates: list[Candidate], run: int, seed: int
    ) -> list[Label]:
        names = [c.name for c in candidates]

        def one(ep: dict[str, Any]) -> tuple[str, Any, str | None]:
            t = Trajectory.from_episode(ep)
            parsed, why = self._ask(
                labelling_messages(t, candidates, self.limits),
                run=run,
                seed=seed,
                parse=lambda s: parse_labels(s, names),
            )
            return t.episode_id, parsed, why

        results: dict[str, tuple[Any, str | None]] = {}
        ex = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="analyst")
        try:
            with Bar(len(episodes), f"labelling (run {run + 1})") as bar:
                futures = [ex.submit(one, ep) for ep in episodes]
                for f in as_completed(futures):
                    eid, parsed, why = f.result()
                    results[eid] = (parsed, why)
                    bar.advance()
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
        out: list[Label] = []
        for ep in episodes:
            parsed, why = results[ep["episode_id"]]
            out += to_labels(ep["episode_id"], names, run, parsed, why)
        return out
