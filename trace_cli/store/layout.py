"""File and directory names inside a store (one place, so every layer agrees)."""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST = "manifest.yaml"
INDEX = "index.duckdb"
TMP_DIR = ".tmp"
NAMES_DIR = "names"
REQUEST_CACHE_DIR = "cache"
KINDS = ("model", "rollouts", "diagnosis", "environment", "adapter", "composition", "eval")
URI_PREFIX = "store://"

# Data file names inside artifacts.
EPISODES = "episodes.parquet"
TOOL_CALLS = "tool_calls.parquet"
REJECTS = "rejects.jsonl"


def default_store_root() -> Path:
    """`$TRACE_STORE`, else `./store`."""
    return Path(os.environ.get("TRACE_STORE") or "store")


PENDING_DIR = ".pending"  # markers of commits whose index update has not finished (see store/commit.py)
