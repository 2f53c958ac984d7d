"""The `environment` artifact: its files are written and read here only (stage synthesize writes one; the
registry, train, compose and report read them).

  environment.yaml   the environment (schema environment.v1.json): template or module, params, tools, target,
                     seed split, checks, calibration attempts, authoring log
  calibration.parquet  one row per calibration attempt (view `calibration`, store/tables.py)
  samples.jsonl      episodes of the last calibration attempt, successes and failures alternating
  calibration_rollouts.parquet  the admitted attempt's episodes as GRPO token sequences (prompt_ids,
                     completion_ids, env_mask, reward, ...) when a model calibrated with GRPO's sampler: train's
                     reuse_calibration takes them as its first steps
  module.py          the accepted module of an LLM author; modules/ every module it wrote, with the reason

A module runs only if it is a file of the artifact whose content the manifest hashes, and always in the
sandbox with this process's limits, never the artifact's (a crafted artifact must not raise its own limits).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from trace_cli.config.loading import load_artifact_yaml
from trace_cli.config.schemas import validate
from trace_cli.errors import UsageError
from trace_cli.store.tables import CALIBRATION

ENV_FILE = "environment.yaml"
SAMPLES_FILE = "samples.jsonl"
CALIBRATION_ROLLOUTS = "calibration_rollouts.parquet"
MODULE_FILE = "module.py"
MODULES_DIR = "modules"
SCHEMA = "environment.v1.json"


def read_environment(art: Any) -> dict[str, Any]:
    """environment.yaml of an artifact, through the hardened loader (a damaged file is exit 2, named)."""
    return load_artifact_yaml(Path(art.path) / ENV_FILE) or {}


def checked(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as it will be stored: plain YAML types only (tuples, numpy floats ...), schema-valid."""
    doc = json.loads(json.dumps(doc, default=str))
    validate(doc, SCHEMA, source=ENV_FILE)
    return doc


def samples(results: list[Any], n: int) -> list[dict[str, Any]]:
    """Up to n episodes: successes and failures alternating, so both kinds are there to read."""
    ok = [r for r in results if r.success]
    bad = [r for r in results if not r.success]
    picked: list[Any] = []
    while len(picked) < n and (ok or bad):
        for pool in (ok, bad):
            if pool and len(picked) < n:
                picked.append(pool.pop(0))
    return [
        {
            "task_id": r.task_id,
            "seed": r.seed,
            "trial": r.trial,
            "reward": r.reward,
            "success": r.success,
            "termination": r.termination,
            "components": r.breakdown.get("components"),
            "variant": (r.metadata or {}).get("variant"),
            "messages": r.messages,
        }
        for r in picked
    ]


def write_environment(
    directory: Path,
    doc: dict[str, Any],
    *,
    attempts: list[dict[str, Any]],
    episodes: list[dict[str, Any]],
    module_src: str | None = None,
    modules: list[dict[str, Any]] | None = None,
) -> None:
    """Every file of the artifact into `directory` (the writer's temp dir); `doc` as `checked` returned it."""
    (directory / ENV_FILE).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
    rows = [
        {
            "capability": doc["capability"],
            **{k: a[k] for k in CALIBRATION.names if k not in ("capability", "params")},
            "params": json.dumps(a["params"], sort_keys=True),
        }
        for a in attempts
    ]
    CALIBRATION.write(rows, directory)
    with open(directory / SAMPLES_FILE, "w", encoding="utf-8") as fh:
        for s in episodes:
            fh.write(json.dumps(s, ensure_ascii=False, default=str) + "\n")
    if module_src is not None:
        (directory / MODULE_FILE).write_text(module_src, encoding="utf-8")
    for m in modules or []:
        if m.get("file") and m.get("source") is not None:
            p = directory / m["file"]
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(m["source"], encoding="utf-8")


def write_calibration_rollouts(directory: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("seed", pa.int64()),
            ("trial", pa.int64()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("n_actions", pa.int64()),
            ("termination", pa.string()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("completion_ids", pa.list_(pa.int32())),
            ("env_mask", pa.list_(pa.int8())),
        ]
    )
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema), directory / CALIBRATION_ROLLOUTS, compression="zstd"
    )


def read_calibration_rollouts(art: Any) -> list[dict[str, Any]]:
    """The kept calibration episodes of an environment artifact, in (seed, trial) order; [] when it has none."""
    from trace_cli.store.rollouts import read_table

    p = art.path / CALIBRATION_ROLLOUTS
    if not p.is_file():
        return []
    return sorted(read_table(p).to_pylist(), key=lambda r: (r["seed"], r["trial"]))


def module_source(art: Any, module: Any) -> str:
    """The module's source, only if it is a file inside the artifact whose content the manifest hashes."""
    if not isinstance(module, str) or not module:
        raise UsageError(f"{art.uri}: {ENV_FILE} has no module file name")
    path = (art.path / module).resolve()
    if not path.is_relative_to(art.path.resolve()) or path.is_symlink():
        raise UsageError(
            f"{art.uri}: the module {module!r} is not a file inside the artifact; refusing to run it"
        )
    rel = path.relative_to(art.path.resolve()).as_posix()
    listed = {f["path"]: f["sha256"] for f in art.manifest.get("files", [])}
    if rel not in listed:
        raise UsageError(
            f"{art.uri}: the module {rel} is not listed in the artifact's manifest; refusing to run it"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != listed[rel]:
        raise UsageError(
            f"{art.uri}: the module {rel} does not match the hash in the manifest (modified after commit?); "
            "refusing to run it (see `trace store verify`)"
        )
    return data.decode("utf-8")
