"""The one OpenAI SDK client factory: references `openai:URL?model=NAME`, keys from the environment, and SDK
errors mapped to ours (a bad key, model or request is the user's to fix: exit 2).

The SDK does the retrying (exponential backoff on connection errors, 408/409/429/5xx) and the timeouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from trace_cli.errors import UsageError

PREFIX = "openai:"
PARAMS = ("model", "api_key_env", "timeout", "max_retries", "concurrency")


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 120.0
    max_retries: int = 3
    concurrency: int = 16

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
    for key, cast in (("timeout", float), ("max_retries", int), ("concurrency", int)):
        if key in params:
            try:
                kw[key] = cast(params[key])
            except ValueError:
                raise UsageError(f"{ref!r}: {key} must be a number, got {params[key]!r}") from None
            if kw[key] < (1 if key == "concurrency" else 0):
                raise UsageError(f"{ref!r}: {key} is out of range ({params[key]})")
    return Endpoint(**kw)


def make_client(ep: Endpoint):
    """An `openai.OpenAI` for the endpoint. Local servers need no key: a placeholder is sent then."""
    try:
        import openai
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise UsageError("the `openai` package is not installed", hint="pip install openai") from e
    key = os.environ.get(ep.api_key_env) or "not-needed"
    return openai.OpenAI(base_url=ep.base_url, api_key=key, timeout=ep.timeout, max_retries=ep.max_retries)


def api_error(e: Exception, ep: Endpoint) -> Exception:
    """An SDK exception as our error: connection/timeout/status problems are the user's (exit 2)."""
    import openai

    where = f"{ep.base_url} (model {ep.model})"
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


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(e, "message", e))
