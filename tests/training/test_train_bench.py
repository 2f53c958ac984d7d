"""benchmarks/train_bench.py runs end to end at a tiny size (correctness only, no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "train_bench.py"),
            "--quick",
            "--multi-turn-turns",
            "0",
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for side in ("trace", "bare_trl"):
        assert res[side]["runs"] and res[side]["runs"][0]["steps"] == 2
        assert res[side]["tokens_per_s"] > 0
    assert set(res["ratio"]) >= {"steps_per_s", "tokens_per_s", "cpu_steps_per_s", "cpu_tokens_per_s"}
    assert "ratio trace / bare" in proc.stdout
