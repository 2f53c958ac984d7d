"""Stable Arrow schemas of the Parquet tables and the DuckDB views the index exposes over them.

Later stages register their tables here (view name -> artifact kind, file name, schema).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class TableSpec:
    view: str
    kind: str
    file: str
    schema: pa.Schema


EPISODES_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("source", pa.string()),
        ("env", pa.string()),
        ("domain", pa.string()),
        ("task_id", pa.string()),
        ("task_family", pa.string()),
        ("trial", pa.int32()),
        ("seed", pa.int64()),
        ("reward", pa.float64()),
        ("success", pa.bool_()),
        ("termination_reason", pa.string()),
        ("n_turns", pa.int32()),
        ("n_tool_calls", pa.int32()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("reference_actions", pa.string()),
        ("info", pa.string()),
    ]
)

TOOL_CALLS_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("turn", pa.int32()),
        ("call_index", pa.int32()),
        ("tool_name", pa.string()),
        ("arguments", pa.string()),
        ("result", pa.string()),
        ("error", pa.bool_()),
        ("requestor", pa.string()),
    ]
)

TABLES: dict[str, TableSpec] = {}


def register_table(spec: TableSpec) -> None:
    TABLES[spec.view] = spec


register_table(TableSpec("episodes", "rollouts", "episodes.parquet", EPISODES_SCHEMA))
register_table(TableSpec("tool_calls", "rollouts", "tool_calls.parquet", TOOL_CALLS_SCHEMA))


def duck_type(t: pa.DataType) -> str:
    """Arrow type -> DuckDB SQL type, for typed empty views."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_int32(t):
        return "INTEGER"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_floating(t):
        return "DOUBLE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    return "VARCHAR"
