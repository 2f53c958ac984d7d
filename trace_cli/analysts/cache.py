"""Response cache of the LLM analysts: `STORE/cache/<analyst>/<sha256 of the canonical request>.json`.

The key is the digest of what determines the answer (endpoint path or model digest, model, messages,
temperature, max_tokens, seed, run) — never headers or the API key, which are not part of a request
description here. Only answers that parsed and validated are stored, so re-running a recipe (or a diagnose
whose request set is unchanged) costs no calls. Files are written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from trace_cli.store.hashing import sha256_json
from trace_cli.store.layout import REQUEST_CACHE_DIR

# Never part of a cache key or entry, whatever a caller passes in.
_SECRET_KEYS = frozenset({"headers", "authorization", "api_key", "api-key", "key"})


def canonical_request(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k.lower() not in _SECRET_KEYS}


def request_key(request: dict[str, Any]) -> str:
    return sha256_json(canonical_request(request))


class ResponseCache:
    def __init__(self, root: str | Path, analyst: str):
        self.dir = Path(root) / REQUEST_CACHE_DIR / analyst
        self.hits = 0
        self.writes = 0

    @classmethod
    def for_store(cls, store: Any, analyst: str, enabled: bool = True) -> ResponseCache | None:
        if store is None or not enabled:
            return None
        return cls(store.root, analyst)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry ({"key", "request", "text", "created_at"}), or None (missing or unreadable)."""
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            return None
        self.hits += 1
        return entry

    def put(self, key: str, request: dict[str, Any], text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        entry = {
            "key": key,
            "request": canonical_request(request),
            "text": text,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, ensure_ascii=False)
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.writes += 1
