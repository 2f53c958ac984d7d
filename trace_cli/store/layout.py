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

# Data file names inside artifacts (the Parquet tables are declared in store/tables.py).
EPISODES = "episodes.parquet"  # rollouts
TOOL_CALLS = "tool_calls.parquet"  # rollouts
TASK_RESULTS = "task_results.parquet"  # rollouts (ingest)
REJECTS = "rejects.jsonl"  # rollouts (ingest)
EVAL_RESULTS = "eval_results.parquet"  # eval
TASK_METADATA = "task_metadata.parquet"  # eval
LABELS = "labels.parquet"  # diagnosis
CAPABILITY_RUNS = "capability_runs.parquet"  # diagnosis
CALIBRATION = "calibration.parquet"  # environment
PRETRAIN_METRICS = "pretrain_metrics.parquet"  # model (pretrain)
TRAIN_METRICS = "train_metrics.parquet"  # model (sft) and adapter (grpo)
GATE_METRICS = "gate_metrics.parquet"  # composition (moe)


def default_store_root() -> Path:
    """`$TRACE_STORE`, else `./store`."""
    return Path(os.environ.get("TRACE_STORE") or "store")


PENDING_DIR = ".pending"  # markers of commits whose index update has not finished (see store/commit.py)
