"""The one OpenAI SDK client: references `openai:URL?model=NAME`, keys from the environment, SDK errors mapped
to ours (a bad key, model or request is the user's to fix: exit 2), and `ChatClient`, the JSON-mode chat
completions the diagnose analyst and the environment author send.

The SDK does the retrying (exponential backoff on connection errors, 408/409/429/5xx, honouring Retry-After)
and the per-read timeouts; nothing here speaks HTTP itself. An endpoint is untrusted: besides the SDK's
timeout, which bounds each read (a server that trickles a byte a second would never hit it), every answer has
a total deadline (`deadline`, the SDK's retries included) and a size cap (`max_answer_mb`, all bytes read for
it), enforced under the SDK at the socket (`answer_limits`, `_LimitedBackend`): past either, the answer ends
with `AnswerLimit`, which the SDK does not retry. This is a low layer: it imports only the SDK and
`trace_cli.errors`, so that analysts, envs and agents can all use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from trace_cli.errors import UsageError, shown

PREFIX = "openai:"
PARAMS = ("model", "api_key_env", "timeout", "max_retries", "concurrency", "deadline", "max_answer_mb")


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 120.0  # seconds one read may wait (the SDK's timeout)
    max_retries: int = 3
    concurrency: int = 16
    deadline: float = 600.0  # seconds one whole answer may take, retries included
    max_answer_mb: float = 32.0  # bytes one answer may take from the server, retries included

    @property
    def display(self) -> str:
        return f"{PREFIX}{self.base_url}?model={self.model}"


def parse_ref(ref: str) -> Endpoint:
    """`openai:http://HOST:PORT/v1?model=NAME[&api_key_env=VAR&timeout=S&max_retries=N&concurrency=N]`.

    The key itself never appears in a reference (references are stored in manifests): it is read from the
    environment variable `api_key_env` (default OPENAI_API_KEY) when the client is made."""
    url = ref[len(PREFIX) :] if ref.startswith(PREFIX) else ref
    parts = urlsplit(url)
    hint = "expected openai:http://HOST:PORT/v1?model=NAME"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{ref!r}: not an http(s) URL", hint=hint)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise UsageError(f"{ref!r}: unknown parameter(s) {', '.join(unknown)} (expected {', '.join(PARAMS)})")
    if not params.get("model"):
        raise UsageError(f"{ref!r}: names no model", hint=hint)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    kw: dict[str, Any] = {"base_url": base, "model": params["model"]}
    if params.get("api_key_env"):
        kw["api_key_env"] = params["api_key_env"]
    for key, cast in (
        ("timeout", float),
        ("max_retries", int),
        ("concurrency", int),
        ("deadline", float),
        ("max_answer_mb", float),
    ):
        if key in params:
            try:
                kw[key] = cast(params[key])
            except ValueError:
                raise UsageError(f"{ref!r}: {key} must be a number, got {params[key]!r}") from None
            low = 1 if key == "concurrency" else 0
            if not kw[key] >= low or (
                key in ("deadline", "max_answer_mb") and not 0 < kw[key] < float("inf")
            ):
                raise UsageError(f"{ref!r}: {key} is out of range ({params[key]})")
    return Endpoint(**kw)


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_NO_KEY = "not-needed"


# ------------------------------------------------------------------------------------- limits of an answer
class AnswerLimit(BaseException):  # noqa: N818 - not an Exception on purpose: the SDK must not retry it
    """An answer ran past its total deadline or its size cap. A BaseException, so that the SDK (which retries
    any Exception of its transport) lets it through at once; the callers below turn it into our errors."""

    def __init__(self, message: str, *, key: str):
        super().__init__(message)
        self.message = message
        self.key = key  # the setting that bounds it (deadline, max_answer_mb)


@dataclass
class _Budget:
    deadline: float  # time.monotonic()
    seconds: float
    max_bytes: int
    received: int = 0

    def left(self, timeout: float | None) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise AnswerLimit(f"no complete answer within {self.seconds:g} s", key="deadline")
        return left if timeout is None else min(timeout, left)

    def took(self, n: int) -> None:
        self.received += n
        if self.received > self.max_bytes:
            raise AnswerLimit(
                f"the answer is larger than {self.max_bytes / (1 << 20):g} MB", key="max_answer_mb"
            )


_LOCAL = threading.local()  # the budget of the answer this thread is waiting for (None: unbounded)
_OPEN: weakref.WeakSet = weakref.WeakSet()  # the connections made under a budget (see `abort`)
_ABORTED = threading.Event()


@contextlib.contextmanager
def answer_limits(ep: Endpoint) -> Iterator[_Budget]:
    """Bound every byte this thread reads from a server until the block ends: by `ep.deadline` seconds in all
    and `ep.max_answer_mb` megabytes (AnswerLimit past either). Yields the budget (`received`: bytes read)."""
    prev = getattr(_LOCAL, "budget", None)
    budget = _Budget(time.monotonic() + ep.deadline, ep.deadline, int(ep.max_answer_mb * (1 << 20)))
    _LOCAL.budget = budget
    try:
        yield budget
    finally:
        _LOCAL.budget = prev


def abort() -> None:
    """Ctrl-C: end every answer being read now, on any thread (their sockets shut down, so a read blocked on a
    silent server returns at once), and refuse new ones; threads waiting on a server then end promptly."""
    _ABORTED.set()
    for stream in list(_OPEN):
        sock = stream.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            sock.shutdown(socket.SHUT_RDWR)


def clear_abort() -> None:
    """A new invocation in the same process (tests, a program that calls `trace_cli.cli.main` again) starts
    unaborted: `abort` is per run, not for the life of the process."""
    _ABORTED.clear()


def _check_abort() -> None:
    if _ABORTED.is_set():
        raise AnswerLimit("interrupted", key="interrupt")


def _limited_stream(inner: Any) -> Any:
    """A network stream whose reads and writes obey the calling thread's answer budget."""
    import httpcore2

    class LimitedStream(httpcore2.NetworkStream):
        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            b = getattr(_LOCAL, "budget", None)
            if b is None:
                return inner.read(max_bytes, timeout)
            _check_abort()
            try:
                data = inner.read(max_bytes, b.left(timeout))
            except (httpcore2.ReadTimeout, httpcore2.ReadError):
                _check_abort()
                b.left(None)  # the total deadline, not the per-read timeout: AnswerLimit
                raise
            _check_abort()
            b.took(len(data))
            return data

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            b = getattr(_LOCAL, "budget", None)
            if b is not None:
                _check_abort()
            inner.write(buffer, timeout if b is None else b.left(timeout))

        def close(self) -> None:
            inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):  # noqa: ANN001
            b = getattr(_LOCAL, "budget", None)
            t = timeout if b is None else b.left(timeout)
            return _limited_stream(inner.start_tls(ssl_context, server_hostname, t))

        def get_extra_info(self, info: str) -> Any:
            return inner.get_extra_info(info)

    stream = LimitedStream()
    _OPEN.add(stream)
    return stream


def _limited_backend() -> Any:
    import httpcore2

    class LimitedBackend(httpcore2.SyncBackend):
        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ANN001
            b = getattr(_LOCAL, "budget", None)
            if b is not None:
                _check_abort()
            t = timeout if b is None else b.left(timeout)
            return _limited_stream(super().connect_tcp(host, port, t, local_address, socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):  # noqa: ANN001
            b = getattr(_LOCAL, "budget", None)
            t = timeout if b is None else b.left(timeout)
            return _limited_stream(super().connect_unix_socket(path, t, socket_options))

    return LimitedBackend()


def _http_client(openai: Any, *, trust_env: bool) -> Any:
    """The SDK's default HTTP client, its connections made through `_limited_backend` (so that every answer
    obeys `answer_limits`). Where the transport is not the one expected (another httpx), the SDK's own."""
    import httpcore2
    import httpx2

    # the SDK's own connection limits (DefaultHttpxClient's, which a given transport replaces)
    transport = httpx2.HTTPTransport(
        trust_env=trust_env, limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
    )
    pool = getattr(transport, "_pool", None)
    if type(pool) is not httpcore2.ConnectionPool or not hasattr(
        pool, "_network_backend"
    ):  # pragma: no cover
        return openai.DefaultHttpxClient(trust_env=trust_env)  # a proxy, or another httpx
    pool._network_backend = _limited_backend()
    return openai.DefaultHttpxClient(transport=transport, trust_env=trust_env)


def make_client(ep: Endpoint):
    """An `openai.OpenAI` for the endpoint. Local servers need no key: a placeholder is sent then. Loopback
    addresses bypass any HTTP(S)_PROXY of the environment (a proxy cannot reach our loopback). Answers are
    bounded under `answer_limits`."""
    try:
        import openai
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise UsageError("the `openai` package is not installed", hint="pip install openai") from e
    key = os.environ.get(ep.api_key_env) or _NO_KEY
    kw: dict[str, Any] = {}
    loopback = urlsplit(ep.base_url).hostname in _LOOPBACK
    if loopback or not any(
        os.environ.get(v) for v in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
    ):
        kw["http_client"] = _http_client(openai, trust_env=not loopback)
    return openai.OpenAI(
        base_url=ep.base_url, api_key=key, timeout=ep.timeout, max_retries=ep.max_retries, **kw
    )


def api_error(e: Exception, ep: Endpoint) -> Exception:
    """An SDK exception as our error: connection/timeout/status problems are the user's (exit 2)."""
    import openai

    where = f"{ep.base_url} (model {ep.model})"
    if isinstance(e, AnswerLimit) and e.key == "interrupt":
        return KeyboardInterrupt()
    if isinstance(e, AnswerLimit):
        return UsageError(
            f"{where}: {e.message}",
            hint=f"every answer is bounded by {e.key} (default {_DEFAULTS[e.key]:g}); to change it add "
            f"&{e.key}=N to the openai: reference",
        )
    if isinstance(e, openai.APITimeoutError):
        return UsageError(f"{where}: no answer within {ep.timeout:g} s after {ep.max_retries} retries")
    if isinstance(e, openai.APIConnectionError):
        return UsageError(
            f"{where}: cannot connect ({e.__cause__ or e}) after {ep.max_retries} retries",
            hint="is the server running? (e.g. `trace serve MODEL --port N`)",
        )
    if isinstance(e, openai.AuthenticationError):
        return UsageError(f"{where}: the key was refused", hint=f"set ${ep.api_key_env}")
    if isinstance(e, openai.APIStatusError):
        return UsageError(f"{where}: HTTP {e.status_code}: {_message(e)}")
    return e


_DEFAULTS = {"deadline": Endpoint.deadline, "max_answer_mb": Endpoint.max_answer_mb}


def _message(e: Any) -> str:
    """The server's own words from an SDK status error: OpenAI's error.message, FastAPI's detail, or text;
    untrusted, so escaped (no control character reaches a terminal) and cut to 300 characters."""
    return shown(" ".join(_raw_message(e).split()), limit=300)


def _raw_message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if err.get(key):
                    return str(err[key])
        elif err:
            return str(err)
    if isinstance(body, str) and body.strip():
        return body
    return str(getattr(e, "message", e))


# ------------------------------------------------------------------------------------------ JSON-mode chat

_SCHEMA_KEYS = {"deadline": "deadline_s", "max_answer_mb": "max_answer_mb"}  # the llm block's names
RETRY_STATUS = frozenset({408, 409, 425, 429})  # with 5xx: the SDK retried these; still failing = unavailable
DROPPABLE = ("response_format", "seed")  # parameters some servers reject; dropped after a 400 naming them


class Unavailable(Exception):
    """No answer after the SDK's retries: timeout, connection error, 408/429/5xx. `unreachable`: nothing
    listened at the address (connection refused, unknown host) on the last try, or no answer came complete
    within the total deadline."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


class MalformedReply(ValueError):
    """An HTTP 200 that is not a chat completion with message text."""


@dataclass(frozen=True)
class Reply:
    body: bytes  # the response body as the server sent it
    attempts: int  # HTTP requests it took (1 + the SDK's retries + re-sends without a rejected parameter)

    def text(self) -> str:
        """The first choice's message text (content parts joined). Raises MalformedReply."""
        try:
            msg = json.loads(self.body)["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
            raise MalformedReply(f"not a chat-completions response ({type(e).__name__})") from e
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str) or not content.strip():
            raise MalformedReply("the response has no message text")
        return content


class ChatClient:
    """Chat completions for one endpoint with fixed sampling parameters, JSON mode on request.

    `complete` raises `Unavailable` (worth asking again later), or `UsageError` for any other 4xx (a bad key,
    model or URL: the user's to fix). `what` names the server in messages ("the analyst server"); `hints`
    maps a status to its fix, in the words of the caller's options. Thread-safe: one SDK client, shared."""

    def __init__(
        self,
        ep: Endpoint,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        json_mode: bool = False,
        what: str = "the server",
        hints: dict[int, str] | None = None,
        client: Any = None,
    ):
        self.ep = ep
        self.params: dict[str, Any] = {}
        if temperature is not None:
            self.params["temperature"] = temperature
        if max_tokens is not None:
            self.params["max_tokens"] = max_tokens
        if json_mode:
            self.params["response_format"] = {"type": "json_object"}
        self.what = what
        self.hints = hints or {}
        self.client = client or make_client(ep)
        self.url = f"{ep.base_url}/chat/completions"
        # no key in the environment: send no Authorization header at all (the SDK's documented opt-out)
        self._headers: dict[str, Any] | None = None
        if self.client.api_key == _NO_KEY:
            import openai

            self._headers = {"Authorization": openai.Omit()}
        self._dropped: set[str] = set()

    def complete(
        self, messages: list[dict[str, Any]], *, seed: int | None = None, max_retries: int | None = None
    ) -> Reply:
        """One answer, with up to `max_retries` (default the endpoint's) retries in all."""
        import openai

        budget = (self.ep.max_retries if max_retries is None else max_retries) + 1
        spent = 0
        while True:
            body = {**self.params, **({"seed": seed} if seed is not None else {})}
            for p in self._dropped:
                body.pop(p, None)
            client = self.client.with_options(max_retries=budget - spent - 1)
            try:
                with answer_limits(self.ep):
                    raw = client.chat.completions.with_raw_response.create(
                        model=self.ep.model, messages=messages, extra_headers=self._headers, **body
                    )
                    content = raw.http_response.content
            except AnswerLimit as e:
                if e.key == "interrupt":
                    raise KeyboardInterrupt from None
                # a server that never completes an answer in time is as good as none (`unreachable`: the
                # caller gives up on it unless it ever answered), so a trickler cannot hold every request
                raise Unavailable(
                    f"{e.message} (llm.{_SCHEMA_KEYS[e.key]} bounds every answer)",
                    unreachable=e.key == "deadline",
                ) from None
            except openai.BadRequestError as e:
                spent += 1  # a 400 is not retried by the SDK
                msg = _message(e)
                bad = [p for p in DROPPABLE if p in msg.lower() and p in body]
                if bad and spent < budget:  # e.g. a server without JSON mode: ask again without it
                    self._dropped.update(bad)
                    continue
                raise self._usage_error(e) from None
            except openai.APIStatusError as e:
                if e.status_code in RETRY_STATUS or e.status_code >= 500:
                    raise Unavailable(f"HTTP {e.status_code}: {_message(e)}") from None
                raise self._usage_error(e) from None
            except openai.APITimeoutError:
                raise Unavailable(f"timed out after {self.ep.timeout:g} s") from None
            except openai.APIConnectionError as e:
                cause = e.__cause__
                refused = any(c.__name__ == "ConnectError" for c in type(cause).__mro__)
                raise Unavailable(
                    f"cannot connect to {self.ep.base_url}: {cause or e}"
                    if refused
                    else f"connection error: {cause or e}",
                    unreachable=refused,
                ) from None
            return Reply(content, spent + raw.retries_taken + 1)

    def _usage_error(self, e: Any) -> UsageError:
        msg = _message(e)
        return UsageError(
            f"{self.what} {self.url} answered HTTP {e.status_code} for model {self.ep.model!r}: {msg}",
            hint=self.hints.get(e.status_code),
        )
