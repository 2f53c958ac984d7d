"""Every Parquet table artifacts hold, declared once as static data: its view, artifact kind, file and columns.

The index (store/index.py) makes one DuckDB view per spec (typed and empty while no artifact has the file);
stages write the file with the spec's Arrow schema. The specs are data here, not registered by the stages at
import time, so the store (the floor) knows every table without importing anything above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.store import layout

# column type name -> (Arrow type, DuckDB type of the typed empty view)
_TYPES: dict[str, tuple[pa.DataType, str]] = {
    "string": (pa.string(), "VARCHAR"),
    "bool": (pa.bool_(), "BOOLEAN"),
    "int32": (pa.int32(), "INTEGER"),
    "int64": (pa.int64(), "BIGINT"),
    "float64": (pa.float64(), "DOUBLE"),
}


@dataclass(frozen=True)
class TableSpec:
    """One table: `view` in the index over the `file` of every artifact of `kind`, with `columns` in file
    order, written `"a b: string, c: int32"` (names, then the type they share)."""

    view: str
    kind: str
    file: str
    columns: str

    def __post_init__(self) -> None:
        _ = self.fields  # a malformed declaration fails when the module is imported, not when it is used

    @cached_property
    def fields(self) -> tuple[tuple[str, str], ...]:
        out = []
        for group in self.columns.split(","):
            names, _, kind = group.partition(":")
            if kind.strip() not in _TYPES or not names.split():
                raise ValueError(f"table {self.view}: bad column group {group.strip()!r}")
            out += [(n, kind.strip()) for n in names.split()]
        return tuple(out)

    @cached_property
    def schema(self) -> pa.Schema:
        return pa.schema([(n, _TYPES[t][0]) for n, t in self.fields])

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.fields]

    def write(self, rows: list[dict[str, Any]], directory: Path, **kw: Any) -> Path:
        """Write `rows` (dicts by column name) as this table's file in `directory` (an artifact's temp dir)."""
        path = Path(directory) / self.file
        pq.write_table(pa.Table.from_pylist(rows, schema=self.schema), path, **kw)
        return path

    def empty_select(self) -> str:
        """The typed NULL columns of the view over no file (`SELECT ... WHERE false`)."""
        return ", ".join(f"CAST(NULL AS {_TYPES[t][1]}) AS {n}" for n, t in self.fields)


EPISODES = TableSpec(
    "episodes",
    "rollouts",
    layout.EPISODES,
    "episode_id source env domain task_id task_family: string, trial: int32, seed: int64, reward: float64, "
    "success: bool, termination_reason: string, n_turns n_tool_calls: int32, "
    "messages tools reference_actions info: string",
)
TOOL_CALLS = TableSpec(
    "tool_calls",
    "rollouts",
    layout.TOOL_CALLS,
    "episode_id: string, turn call_index: int32, tool_name arguments result: string, error: bool, "
    "requestor: string",
)
TASK_RESULTS = TableSpec(  # ingest: pass@1 and pass^k per task
    "task_results",
    "rollouts",
    layout.TASK_RESULTS,
    "task_id domain: string, trials successes: int32, mean_reward: float64, pass_hat_k: string",
)
EVAL_RESULTS = TableSpec(
    "eval_results",
    "eval",
    layout.EVAL_RESULTS,
    "task_id task_family: string, seed: int64, trials successes: int32, mean_reward: float64, "
    "pass_hat_k: string",
)
TASK_METADATA = TableSpec(
    "task_metadata",
    "eval",
    layout.TASK_METADATA,
    "task_id task_family: string, seed: int64, required_capabilities reference_actions: string",
)
LABELS = TableSpec(
    "labels",
    "diagnosis",
    layout.LABELS,
    "episode_id task_id: string, success: bool, capability: string, run: int32, label: string, "
    "weight: float64, rationale analyst: string",
)
CAPABILITY_RUNS = TableSpec(
    "capability_runs",
    "diagnosis",
    layout.CAPABILITY_RUNS,
    "capability: string, run: int32, er_minus er_plus delta coverage: float64, passed: bool, "
    "lacking_failed present_failed lacking_passed present_passed errors: float64",
)
CALIBRATION = TableSpec(
    "calibration",
    "environment",
    layout.CALIBRATION,
    "capability: string, attempt: int32, params: string, seeds rollouts: int32, "
    "mean_reward mean_success frac_all0 frac_all1 frac_constant_reward: float64, in_band: bool, "
    "wall_s: float64, next: string",
)
PRETRAIN_METRICS = TableSpec(
    "pretrain_metrics",
    "model",
    layout.PRETRAIN_METRICS,
    "step: int32, loss grad_norm lr elapsed_s copy_accuracy: float64",
)
SFT_METRICS = TableSpec(
    "sft_metrics",
    "model",
    layout.TRAIN_METRICS,
    "step: int64, loss grad_norm lr: float64, tokens: int64, elapsed_s: float64",
)
GRPO_METRICS = TableSpec(
    "train_metrics",
    "adapter",
    layout.TRAIN_METRICS,
    "step: int64, reward reward_std frac_reward_zero_std success turns completion_length clipped_ratio "
    "max_length_frac kl entropy loss grad_norm learning_rate num_tokens step_time: float64, "
    "episodes rollouts: int64",
)
GATE_METRICS = TableSpec(
    "gate_metrics",
    "composition",
    layout.GATE_METRICS,
    "step: int64, loss ce aux token_accuracy elapsed_s: float64",
)

TABLES: dict[str, TableSpec] = {
    t.view: t
    for t in (
        EPISODES,
        TOOL_CALLS,
        TASK_RESULTS,
        EVAL_RESULTS,
        TASK_METADATA,
        LABELS,
        CAPABILITY_RUNS,
        CALIBRATION,
        PRETRAIN_METRICS,
        SFT_METRICS,
        GRPO_METRICS,
        GATE_METRICS,
    )
}

# the rollouts tables' schemas, which every producer of episodes writes (store/rollouts.py, ingest)
EPISODES_SCHEMA = EPISODES.schema
TOOL_CALLS_SCHEMA = TOOL_CALLS.schema
