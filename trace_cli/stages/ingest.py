"""Stage `ingest`: τ²-bench results JSON or JSONL episodes -> a `rollouts` artifact (episodes + tool_calls).

The readers (`formats.tau2_read`, `formats.jsonl`) turn the file into episode rows and bad records; this stage
decides what to write. Bad input is found before anything is written: every problem names the record and the
field. With `on_error: fail` (default) any problem aborts (exit 2, nothing written); with `skip` the good
records are written and the bad ones go to rejects.jsonl with their reasons.

Speed (issue 2): the readers parse with orjson and encode the JSON columns straight to UTF-8 bytes for Arrow
(see `formats.codec`), JSONL records are proven valid by a check compiled from the schema, and the cyclic
garbage collector is off while the records are built (it otherwise spends most of the parse time walking
millions of young, acyclic containers).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.errors import InputError
from trace_cli.formats import jsonl, tau2_read
from trace_cli.formats.codec import TOO_DEEP, TOO_DEEP_FIX
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store, file_input, layout
from trace_cli.store.metrics import summarize as pass_summary
from trace_cli.store.rollouts import rows_table, string_array, write_tables
from trace_cli.store.tables import EPISODES_SCHEMA, TASK_RESULTS, TOOL_CALLS_SCHEMA

NAME = "ingest"
PATH_KEYS = ("path",)
OUTPUTS = {"rollouts": "rollouts"}


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    path = Path(cfg["path"])
    if cfg["format"] == "jsonl" and path.is_dir():
        raise InputError(f"{path}: is a directory; expected a JSONL file")
    run_dir = tau2_read.run_dir(path) if cfg["format"] == "tau2" else None
    inp = file_input("source_file", run_dir or path)  # a run directory enters the id by all its files
    if "source" not in cfg:
        cfg["source"] = path.name
    id_config = {k: v for k, v in cfg.items() if k != "path"}  # the file enters the id by content
    return Prepared(NAME, cfg, id_config, [inp], dict(OUTPUTS)).finalize()


# ----------------------------------------------------------------------------- run


TASKS_FILE, TASK_RESULTS_SCHEMA = TASK_RESULTS.file, TASK_RESULTS.schema


def _tasks_table(per_task: list[dict[str, Any]]) -> pa.Table:
    rows = [
        {k: t[k] for k in ("task_id", "domain", "trials", "successes", "mean_reward")}
        | {"pass_hat_k": json.dumps(t["pass_hat_k"])}
        for t in per_task
    ]
    return pa.Table.from_pylist(rows, schema=TASK_RESULTS_SCHEMA)


_TEXT_COLUMNS = ("messages", "tools", "reference_actions", "info", "arguments", "result")


def _episodes_table(eps: list[dict[str, Any]]) -> pa.Table:
    cols = {f.name: [e.get(f.name) for e in eps] for f in EPISODES_SCHEMA}
    for k in _TEXT_COLUMNS:
        if k in cols:
            cols[k] = string_array(cols[k])
    return pa.Table.from_pydict(cols, schema=EPISODES_SCHEMA)


def _is_jsonl(path: Path) -> bool:
    """Whether a file given as τ²-bench results is JSON Lines instead (read from its first 64 KiB)."""
    from trace_cli.config.loading import looks_like_jsonl

    if path.is_dir():
        return False
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024).decode("utf-8", "replace")
    except OSError:
        return False
    return looks_like_jsonl(head)


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    # Parsing builds millions of small containers, none in a reference cycle: with the cyclic collector on,
    # CPython re-walks the ever-growing heap again and again (most of the CPU time of a big ingest).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(prepared, store, name=name, overrides=overrides, replace=replace)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(prepared: Prepared, store: Store, *, name, overrides, replace) -> dict[str, Artifact]:
    cfg = prepared.config
    path = Path(cfg["path"])
    parse = tau2_read.parse if cfg["format"] == "tau2" else jsonl.parse
    try:
        good, rejected = parse(path, cfg["source"])
    except RecursionError as e:  # a value nested deeper than the parsers/validator can recurse
        raise InputError(f"{path}: {TOO_DEEP}", hint=TOO_DEEP_FIX) from e
    except InputError as e:
        # (a file that is not UTF-8 text keeps its own message: it names the first bad byte)
        if cfg["format"] == "tau2" and "not a UTF-8 text file" not in str(e) and _is_jsonl(path):
            raise InputError(
                f"{path}: looks like JSON Lines (one JSON object per line), not a τ²-bench results file "
                "(one JSON object with `info`, `tasks` and `simulations`)",
                hint=f"ingest it with `trace ingest jsonl {path}`, or `format: jsonl` in a recipe",
            ) from e
        raise
    excluded = [b for b in rejected if b.excluded]
    bad = [b for b in rejected if not b.excluded]
    if bad and cfg["on_error"] == "fail":
        shown = "\n".join(f"  {b}" for b in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise InputError(
            f"{path}: {len(bad)} bad record{'s' if len(bad) != 1 else ''}; nothing was written:\n{shown}{more}",
            hint="fix the file, or pass --on-error skip to ingest the good records and get rejects.jsonl",
        )
    if not good:
        why = f"{len(bad)} rejected" + (
            f", {len(excluded)} excluded as τ²-bench excludes them" if excluded else ""
        )
        shown = "\n".join(f"  {b}" for b in (excluded + bad)[:5])
        more = f"\n  ... and {len(rejected) - 5} more" if len(rejected) > 5 else ""
        raise InputError(
            f"{path}: no records to ingest ({why}); nothing was written:\n{shown}{more}",
            hint="an artifact (and its rejects.jsonl) needs at least one good record; every reason is above"
            if len(rejected) <= 5
            else "an artifact (and its rejects.jsonl) needs at least one good record; "
            "run without --on-error skip to see the first 20 reasons",
        )
    with prepared.writer(store, "rollouts", name=name, overrides=overrides, replace=replace) as w:
        calls = [r for _, rows in good for r in rows]
        write_tables(
            w.path,
            _episodes_table([ep for ep, _ in good]),
            rows_table(calls, TOOL_CALLS_SCHEMA, text=_TEXT_COLUMNS),
        )
        if rejected:
            with open(w.path / layout.REJECTS, "w", encoding="utf-8") as f:
                for b in rejected:
                    line = {"where": b.where, "errors": b.problems, "record": b.raw}
                    if b.excluded:
                        line["excluded"] = True
                    f.write(json.dumps(line, default=str) + "\n")
        n_succ = sum(1 for ep, _ in good if ep["success"])
        passk, per_task = pass_summary([ep for ep, _ in good], "domain")
        pq.write_table(_tasks_table(per_task), w.path / TASKS_FILE)
        w.summary.update(
            {
                "episodes": len(good),
                "successes": n_succ,
                "failures": len(good) - n_succ,
                "tool_calls": len(calls),
                "rejected": len(bad),
                "excluded": len(excluded),
                "derived_task_ids": sum(1 for ep, _ in good if ep.get("task_id_derived")),
                "format": cfg["format"],
                "source": cfg["source"],
                "tasks": passk["tasks"],
                "pass@1": passk["pass@1"],
                "pass^k": passk["pass^k"],
                "domains": passk["groups"],
            }
        )
    return {"rollouts": w.artifact}
