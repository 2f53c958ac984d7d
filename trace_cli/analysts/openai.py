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

from trace_cli.analysts.cache import request_key
from trace_cli.analysts.llm_base import Answer, LLMAnalyst, llm_settings
from trace_cli.analysts.prompts import AnalystResponseError
from trace_cli.errors import UsageError
from trace_cli.llm.openai_client import ChatClient, Endpoint, MalformedReply, Unavailable
from trace_cli.progress import Bar

T = TypeVar("T")

SEED_STRIDE = 1_000_003  # a re-ask sends seed + k * stride so a seeded server does not repeat itself


class OpenAIAnalyst(LLMAnalyst):
    name = "openai"

    def __init__(self, config: dict[str, Any], store: Any = None):
        llm = llm_settings(config)
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
        super().__init__(llm, store)
        self.max_retries = int(llm["max_retries"])
        self.concurrency = int(llm["concurrency"])
        ep = Endpoint(
            base_url=self.base_url,
            model=self.model,
            api_key_env=self.api_key_env,
            timeout=float(llm["timeout_s"]),
            deadline=float(llm["deadline_s"]),
            max_answer_mb=float(llm["max_answer_mb"]),
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

    def _ask_one(self, messages, *, run: int, seed: int, parse: Callable[[str], T], what: str) -> Answer:
        return self._ask(messages, run=run, seed=seed, parse=parse)

    def _ask_all(self, prompts, *, run: int, seed: int, parse: Callable[[str], T], what: str) -> list[Answer]:
        """Every prompt asked on `concurrency` threads; answers in the prompts' order."""
        answers: list[Answer] = [(None, "no answer")] * len(prompts)
        ex = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="analyst")
        try:
            with Bar(len(prompts), what) as bar:
                futures = {
                    ex.submit(self._ask, m, run=run, seed=seed, parse=parse): i for i, m in enumerate(prompts)
                }
                for f in as_completed(futures):
                    answers[futures[f]] = f.result()
                    bar.advance()
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
        return answers
