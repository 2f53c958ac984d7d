"""Parquet read from a store is bounded in memory and a damaged one is a clear error naming it (issue 46,
item 4): a store may come from someone else, and a tiny crafted file can decompress to gigabytes."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trace_testing import episode, run_trace, write_jsonl


@pytest.fixture
def rollouts(tmp_path) -> tuple[Path, Path]:
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1"), episode("e2", reward=0.0)])
    r = run_trace("ingest", "jsonl", f, "--store", store, "--name", "r")
    assert r.returncode == 0, r.stderr
    art = next(p for p in (store / "rollouts").iterdir() if (p / "manifest.yaml").is_file())
    return store, art / "episodes.parquet"


def _bounded(*args, cwd: Path) -> subprocess.CompletedProcess:
    """`trace ARGS` with at most 6 GB of address space, so that a bomb that is not refused ends in an error
    (MemoryError) instead of filling the machine."""
    exe = Path(sys.executable).parent / "trace"

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    env = dict(os.environ, TRACE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    env.pop("TRACE_STORE", None)
    return subprocess.run(
        [str(exe), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )


COMMANDS = [
    ("export", "jsonl", "store://rollouts/r", "--out", "out.jsonl"),
    ("diagnose", "--rollouts", "store://rollouts/r"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_damaged_parquet_file_is_named(rollouts, tmp_path, command):
    store, path = rollouts
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    r = _bounded(*command, "--store", store, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and str(path) in r.stderr, r.stderr
    assert "not a readable Parquet file" in r.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_parquet_decompression_bomb_is_refused(rollouts, tmp_path, command):
    """1.2 GB of repeated text in a file of about a megabyte (zstd), in row groups of 8 MB."""
    store, path = rollouts
    chunk = pa.table({"episode_id": ["e"], "messages": ["a" * (8 << 20)]})
    os.chmod(path, 0o644)
    with pq.ParquetWriter(path, chunk.schema, compression="zstd", compression_level=1) as w:
        for _ in range(150):
            w.write_table(chunk)
    assert path.stat().st_size < 8 << 20
    r = _bounded(*command, "--store", store, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "internal error" not in r.stderr and str(path) in r.stderr, r.stderr[-2000:]
    assert "decompression bomb" in r.stderr
