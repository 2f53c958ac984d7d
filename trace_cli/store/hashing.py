"""sha256 of files and of canonical JSON, and content-derived artifact ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """Key-sorted, whitespace-free JSON: equal configs give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


def artifact_id(stage: str, config: Any, input_digests: list[str]) -> str:
    """16 hex chars derived from (stage, canonical config, input digests); order of inputs matters."""
    return sha256_json({"stage": stage, "config": config, "inputs": list(input_digests)})[:16]
