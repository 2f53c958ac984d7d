"""Smoke run of benchmarks/rollout_bench.py on the session's tiny model (its build is found, not redone)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tinymodel import CONFIG

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout_bench.py"


def test_rollout_bench_smoke(tiny_model, tmp_path):
    spec = importlib.util.spec_from_file_location("rollout_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    rc = bench.main(
        [
            "--presets",
            "tiny",
            "--workdir",
            str(tiny_model.store_root.parent),
            "--corpus-seeds",
            str(CONFIG["corpus_seeds"]),
            "--episodes",
            "3",
            "--naive-episodes",
            "2",
            "--batch-sizes",
            "1",
            "3",
            "--max-new-tokens",
            "4",
            "--max-turns",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["commit"] and isinstance(doc["dirty"], bool)  # the result names the code it measured
    assert doc["models"]["tiny"]["skipped"] is True
    rows = doc["results"]
    assert [(r["mode"], r["batch_size"]) for r in rows] == [("naive", 1), ("rollout", 1), ("rollout", 3)]
    assert all(r["same_as_naive"] for r in rows)
    assert rows[1]["compared_episodes"] == 2 and rows[2]["generate_calls"] < rows[1]["generate_calls"]
    for r in rows:
        assert r["episodes_per_s"] > 0 and r["gen_tokens_per_s"] > 0 and r["gen_tokens"] > 0
    assert (tiny_model.hf / "config.json").is_file()  # the shared workdir was not removed
