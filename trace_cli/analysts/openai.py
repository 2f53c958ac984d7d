"""The `openai` analyst: any OpenAI-compatible chat-completions server (vLLM, llama.cpp, SGLang, OpenAI, …).

One request per episode per labelling run (plus one for discovery), `response_format={"type": "json_object"}`,
answers validated against the schemas in `prompts.py`. Transient failures — timeouts, connection errors,
HTTP 408/429/5xx — and invalid answers are retried with exponential backoff and jitter, up to
`llm.max_retries` times; an episode that still fails gets ERROR labels (the stage leaves them out of the
counts). Other 4xx answers (bad key, unknown model) stop the stage with a UsageError. The API key is read
from the environment variable named by `llm.api_key_env` at request time and is never logged or stored;
without it no Authorization header is sent (local servers need none).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
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
BACKOFF_BASE_S = 0.5  # first retry waits ~0.5 s, then 1, 2, 4 … (jittered), capped at BACKOFF_MAX_S
BACKOFF_MAX_S = 20.0
RETRY_STATUS = frozenset({408, 425, 429})
SEED_STRIDE = 1_000_003  # retries send seed + attempt * stride so a seeded server does not repeat itself
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_DROPPABLE = ("response_format", "seed")  # parameters some servers reject; dropped after a 400 naming them


class _Transient(Exception):
    """Worth another try (timeout, connection error, 408/429/5xx)."""


class _Unreachable(_Transient):
    """Nothing listens at the address (connection refused, unknown host)."""


def backoff_s(attempt: int) -> float:
    """Wait before retry number `attempt` (1, 2, …): exponential with full jitter in [0.5, 1] of the step."""
    step = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** (attempt - 1)))
    return step * (0.5 + 0.5 * random.random())


def _server_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300] or "(empty body)"
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    if isinstance(doc, dict) and not doc.get("error") and doc.get("detail"):
        err = doc["detail"]
    return " ".join(str(err).split())[:300]


def _content(body: bytes) -> str:
    """The first choice's message text from a chat-completions response."""
    try:
        doc = json.loads(body)
        msg = doc["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise AnalystResponseError(f"not a chat-completions response ({type(e).__name__})") from e
    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str) or not content.strip():
        raise AnalystResponseError("the response has no message text")
    return content


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
        self.url = f"{self.base_url}/chat/completions"
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(
                f"llm.base_url {llm['base_url']!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)"
            )
        self.path = parsed.path
        self.model = str(llm["model"])
        self.api_key_env = str(llm["api_key_env"])
        self.temperature = float(llm["temperature"])
        self.max_tokens = int(llm["max_tokens"])
        self.timeout_s = float(llm["timeout_s"])
        self.max_retries = int(llm["max_retries"])
        self.concurrency = int(llm["concurrency"])
        self.limits = PromptLimits.from_config(llm)
        self.cache = ResponseCache.for_store(store, self.name, bool(llm["cache"]))
        handlers: list[Any] = []
        if parsed.hostname in _LOOPBACK:
            handlers.append(urllib.request.ProxyHandler({}))  # a proxy cannot reach our loopback
        self._opener = urllib.request.build_opener(*handlers)
        self._lock = threading.Lock()
        self._dropped: set[str] = set()
        self._ever_answered = False
        self.calls = 0  # HTTP requests sent (cache hits send none)

    # ------------------------------------------------------------------------------------------ HTTP

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _post(self, messages: list[dict[str, str]], seed: int) -> str:
        """One HTTP attempt -> the answer text. Raises _Transient, AnalystResponseError or UsageError."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
            "response_format": {"type": "json_object"},
        }
        for p in self._dropped:
            body.pop(p, None)
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=self._headers(), method="POST"
        )
        with self._lock:
            self.calls += 1
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            try:
                msg = _server_message(e.read())
            except Exception:  # noqa: BLE001 - the body is only for the message
                msg = e.reason or ""
            if e.code in RETRY_STATUS or e.code >= 500:
                raise _Transient(f"HTTP {e.code}: {msg}") from None
            if e.code == 400:
                bad = [p for p in _DROPPABLE if p in msg.lower() and p not in self._dropped]
                if bad:  # e.g. a server without JSON mode: ask again without that parameter
                    with self._lock:
                        self._dropped.update(bad)
                    raise _Transient(f"HTTP 400 (retrying without {', '.join(bad)}): {msg}") from None
            hint = {
                401: f"set a valid key in ${self.api_key_env} (--api-key-env names the variable)",
                403: f"the key in ${self.api_key_env} is not allowed to use this model",
                404: "check --base-url (it usually ends in /v1) and --llm-model (the server's model name)",
            }
            raise UsageError(
                f"the analyst server {self.url} answered HTTP {e.code} for model {self.model!r}: {msg}",
                hint=hint.get(e.code),
            ) from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, TimeoutError):
                raise _Transient(f"timed out after {self.timeout_s:g} s") from None
            if isinstance(reason, OSError) and not isinstance(reason, ConnectionResetError):  # refused, DNS
                raise _Unreachable(f"cannot connect to {self.base_url}: {reason}") from None
            raise _Transient(f"connection error: {reason}") from None
        except TimeoutError:
            raise _Transient(f"timed out after {self.timeout_s:g} s") from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise _Transient(f"connection error: {type(e).__name__}: {e}") from None
        self._ever_answered = True
        return _content(raw)

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
        unreachable = True
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(backoff_s(attempt))
            try:
                text = self._post(messages, seed + attempt * SEED_STRIDE)
            except _Transient as e:
                unreachable = unreachable and isinstance(e, _Unreachable)
                why = str(e)
                continue
            unreachable = False
            try:
                value = parse(text)
            except AnalystResponseError as e:
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
