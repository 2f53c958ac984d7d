"""Reading and writing `rollouts` artifacts: the `episodes` and `tool_calls` Parquet tables.

Messages are stored as JSON in OpenAI chat format, normalised so every producer (τ²-bench ingest, JSONL
ingest, `trace eval`) looks the same to consumers: assistant `tool_calls` are
`{"id", "type": "function", "function": {"name", "arguments": <object, or the raw string if it was not JSON>}}`,
tool results are `{"role": "tool", "tool_call_id", "content", "error"}`; a tool call made by the user side
(τ²-bench telecom) carries `"requestor": "user"`.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.errors import UsageError, json_error, shown
from trace_cli.store import layout
from trace_cli.store.tables import EPISODES_SCHEMA, TOOL_CALLS_SCHEMA


def _json_text(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def tool_call_rows(
    episode_id: str, messages: list[dict[str, Any]], *, dumps: Callable[[Any], str | bytes] = _json_text
) -> list[dict[str, Any]]:
    """One row per tool call, paired with its result (by tool_call_id, else the next unclaimed tool message).

    `dumps` encodes object arguments and non-string results (ingest passes orjson's, which gives UTF-8 bytes:
    Arrow takes those for a string column without re-encoding).
    """
    return [
        dict(zip(TOOL_CALL_COLUMNS, t, strict=True))
        for t in tool_call_tuples(episode_id, messages, dumps=dumps)
    ]


TOOL_CALL_COLUMNS = tuple(TOOL_CALLS_SCHEMA.names)


def tool_call_tuples(
    episode_id: str, messages: list[dict[str, Any]], *, dumps: Callable[[Any], str | bytes] = _json_text
) -> list[tuple]:
    """`tool_call_rows` as tuples in TOOL_CALL_COLUMNS order (cheaper to build; `rows_table` takes them)."""
    call_ids = set()
    with_calls: list[tuple[int, dict[str, Any], list[dict[str, Any]]]] = []
    tool_msgs: list[tuple[int, dict[str, Any]]] = []
    for i, m in enumerate(messages):
        tcs = m.get("tool_calls")
        if tcs:
            with_calls.append((i, m, tcs))
            for tc in tcs:
                if tc.get("id"):
                    call_ids.add(tc.get("id"))
        if m.get("role") == "tool":
            tool_msgs.append((i, m))
    results: dict[str, dict[str, Any]] = {}
    unclaimed: list[tuple[int, dict[str, Any]]] = []
    for i, m in tool_msgs:
        if m.get("tool_call_id"):
            results.setdefault(m["tool_call_id"], m)
        # a result that answers a known call id belongs to that call only; never pair it by position
        if m.get("tool_call_id") not in call_ids:
            unclaimed.append((i, m))
    used: set[int] = set()
    rows = []
    for turn, m, tcs in with_calls:
        for k, tc in enumerate(tcs):
            fn = tc.get("function", tc)
            res = results.get(tc.get("id") or "")
            if res is None:
                for j, tm in unclaimed:
                    if j > turn and id(tm) not in used:
                        res = tm
                        break
            if res is not None:
                used.add(id(res))
            args = fn.get("arguments")
            rows.append(
                (
                    episode_id,
                    turn,
                    k,
                    fn.get("name"),
                    args if isinstance(args, str) else dumps(args),
                    None if res is None else _text(res.get("content"), dumps),
                    bool(res.get("error")) if res is not None else False,
                    tc.get("requestor") or m.get("requestor") or m.get("role"),
                )
            )
    return rows


def _text(content: Any, dumps: Callable[[Any], str | bytes] = _json_text) -> str | bytes | None:
    if content is None or isinstance(content, str):
        return content
    return dumps(content)


def write_tables(
    out_dir: Path,
    episodes: Iterable[dict[str, Any]] | pa.Table,
    tool_calls: Iterable[dict[str, Any]] | pa.Table,
) -> None:
    """Write episodes.parquet and tool_calls.parquet with the stable schemas (missing columns -> NULL).

    Each table is given as row dicts, or already built (`rows_table`) with that schema.
    """
    ep = episodes if isinstance(episodes, pa.Table) else _table(list(episodes), EPISODES_SCHEMA)
    tc = tool_calls if isinstance(tool_calls, pa.Table) else _table(list(tool_calls), TOOL_CALLS_SCHEMA)
    for t, schema in ((ep, EPISODES_SCHEMA), (tc, TOOL_CALLS_SCHEMA)):
        if not t.schema.equals(schema):
            raise ValueError(f"table schema {t.schema} is not {schema}")
    pq.write_table(ep, out_dir / layout.EPISODES, compression="zstd")
    pq.write_table(tc, out_dir / layout.TOOL_CALLS, compression="zstd")


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def rows_table(rows: list[tuple], schema: pa.Schema, *, text: Iterable[str] = ()) -> pa.Table:
    """Tuples in schema column order -> a table. String columns take str or UTF-8 bytes; the `text` ones
    (long values, hundreds of MB) are built with `string_array`."""
    text = set(text)
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    arrays = [
        string_array(c) if f.name in text else pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)
    ]
    return pa.Table.from_pydict(dict(zip(schema.names, arrays, strict=True)), schema=schema)


def string_array(values: Sequence[Any]) -> pa.Array | pa.ChunkedArray:
    """A string column from UTF-8 bytes (or str, or None), through one joined buffer: for hundreds of MB
    `pa.array` costs several times more (its builder grows by reallocation, and the first big allocation from
    Arrow's pool is slow). Same result and same UTF-8 check; anything else goes to `pa.array` as before."""
    try:
        return _joined(values, values, None)  # all bytes: the common case
    except TypeError:  # a None (no len) or a str (join refuses it)
        pass
    has_null = False
    data: list[bytes] = []
    for v in values:
        t = type(v)
        if t is bytes:
            data.append(v)
        elif t is str:
            data.append(v.encode("utf-8"))
        elif v is None:
            has_null = True
            data.append(b"")
        else:
            return pa.array(values, pa.string())  # not text: Arrow's error, as before
    validity = pa.array([v is not None for v in values], pa.bool_()).buffers()[1] if has_null else None
    return _joined(values, data, validity)


def _joined(
    values: Sequence[Any], data: Sequence[bytes], validity: pa.Buffer | None
) -> pa.Array | pa.ChunkedArray:
    offsets = array("q", accumulate(map(len, data), initial=0))
    if offsets[-1] >= 2**31:
        return pa.array(values, pa.string())  # over one array's 2 GiB: Arrow chunks it
    joined = b"".join(data)
    arr = pa.Array.from_buffers(
        pa.string(), len(data), [validity, pa.py_buffer(array("i", offsets)), pa.py_buffer(joined)]
    )
    try:
        arr.validate(full=True)  # UTF-8, like pa.array
    except pa.ArrowInvalid:
        return pa.array(values, pa.string())  # raises, with Arrow's usual message
    return arr


# The uncompressed data one Parquet file of a store may hold when it is read into memory: a store may come
# from someone else, and a 51 KB file can decompress to gigabytes (the largest real rollouts artifacts hold a
# few hundred MB).
MAX_TABLE_BYTES = 1 << 30
_DAMAGED = (
    "the file is damaged or was crafted: restore the artifact from a backup, or delete it and rerun the step "
    "that made it; `trace store verify` checks every file against its manifest"
)


def read_table(path: Path) -> pa.Table:
    """A Parquet file of a store, read within bounds: never through a symbolic link, at most MAX_TABLE_BYTES
    of data (as its metadata states before anything is decompressed, and as read, row group by row group);
    a damaged, truncated or oversized file is a UsageError (exit 2) naming it."""
    from trace_cli.store.artifacts import refuse_link

    refuse_link(path)
    limit = (
        f"more than the {MAX_TABLE_BYTES >> 20} MB a store table may hold in memory (a decompression bomb?)"
    )
    try:
        f = pq.ParquetFile(path)
        md = f.metadata
        claimed = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        if claimed > MAX_TABLE_BYTES:
            raise UsageError(f"{path}: holds {claimed >> 20} MB of data uncompressed, {limit}", hint=_DAMAGED)
        parts, size = [], 0
        for i in range(md.num_row_groups):
            part = f.read_row_group(i)
            size += part.nbytes
            if size > MAX_TABLE_BYTES:
                raise UsageError(f"{path}: decompresses to {limit}", hint=_DAMAGED)
            parts.append(part)
        return pa.concat_tables(parts) if parts else f.schema_arrow.empty_table()
    except (pa.ArrowException, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(
            f"{path}: not a readable Parquet file ({shown(first, limit=200)})", hint=_DAMAGED
        ) from None


def read_episodes(artifact_dir: Path) -> list[dict[str, Any]]:
    """Episodes of a rollouts artifact as dicts, with `messages`, `tools`, `reference_actions`, `info` decoded
    (read within bounds, see `read_table`; a value that is not JSON is a UsageError naming the file)."""
    path = artifact_dir / layout.EPISODES
    rows = read_table(path).to_pylist()
    for n, r in enumerate(rows):
        for k in ("messages", "tools", "reference_actions", "info"):
            if r.get(k) is not None:
                try:
                    r[k] = json.loads(r[k])
                except (ValueError, RecursionError, TypeError) as e:
                    raise UsageError(
                        f"{path}: row {n}: `{k}` is not readable JSON ({json_error(e)})", hint=_DAMAGED
                    ) from None
    return rows


def result_row(
    r: Any,
    episode_id: str,
    source: str,
    info: dict[str, Any],
    *,
    messages: list[dict[str, Any]] | None = None,
    trial: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(episode row, tool-call rows) of one rollout result (`envs.rollout.EpisodeResult`) as the tables store it;
    `messages`/`trial` replace the result's own."""
    meta = r.metadata or {}
    ref = meta.get("reference_actions")
    messages = r.messages if messages is None else messages
    calls = tool_call_rows(episode_id, messages)
    row = {
        "episode_id": episode_id,
        "source": source,
        "env": r.env,
        "domain": r.env,
        "task_id": r.task_id,
        "task_family": meta.get("family"),
        "trial": r.trial if trial is None else trial,
        "seed": r.seed,
        "reward": r.reward,
        "success": r.success,
        "termination_reason": r.termination,
        "n_turns": r.n_actions,
        "n_tool_calls": len(calls),
        "messages": _json_text(messages),
        "tools": _json_text(r.tools),
        "reference_actions": None if ref is None else _json_text(ref),
        "info": json.dumps(info, ensure_ascii=False, default=str),
    }
    return row, calls
