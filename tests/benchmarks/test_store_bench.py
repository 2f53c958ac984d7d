"""benchmarks/store_bench.py runs end to end at a tiny size (correctness only, no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path


def test_store_bench_tiny(tmp_path, tau2_dir, run_benchmark):
    out = tmp_path / "bench.json"
    proc = run_benchmark(
        "store_bench.py",
        *"--quick --episodes 60 --shard-episodes 15 --repeats 2 --baseline-chunksize 25".split(),
        *("--tau2-dir", str(tau2_dir), "--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    corpus = res["corpus"]
    assert corpus["episodes"] == 60 and corpus["tool_calls"] >= 600  # >= 10 tool calls per episode
    assert len(corpus["shards"]) == 6  # 3 domains x 2 shards of <= 15 episodes
    for fmt in ("tau2", "jsonl"):
        assert res["ingest"][fmt]["episodes"] == 60
        assert res["ingest"][fmt]["tool_calls"] == corpus["tool_calls"]
    assert [r["format"] for r in res["subprocess"]] == ["tau2", "jsonl"]
    q = res["query"]
    assert q["results_equal"] and q["tau2_store_equal"]
    assert q["sql"]["rows_scanned"] == corpus["tool_calls"] == q["tool_calls_counted"]
    assert sum(v["calls"] for v in q["result"].values()) == corpus["tool_calls"]
    assert {"cpu_count", "python", "duckdb", "pyarrow"} <= set(res["machine"])
    assert "speed-up SQL vs pandas" in proc.stdout


def test_corpus_shapes_match_the_real_files(tmp_path, tau2_dir):
    """Generated τ² shards are results files `trace ingest tau2` reads; ids unique; rewards 0/1."""
    import store_bench

    domains = store_bench.load_domains(tau2_dir)
    meta = store_bench.generate_corpus(
        domains, tmp_path / "c", episodes=30, target_calls=300, shard_episodes=100, trials=2, seed=1
    )
    ids, calls = set(), 0
    for shard in meta["shards"]:
        doc = json.loads(Path(shard["path"]).read_text())
        assert {"info", "tasks", "simulations"} <= set(doc)
        task_ids = {t["id"] for t in doc["tasks"]}
        for s in doc["simulations"]:
            assert s["id"] not in ids and s["task_id"] in task_ids
            assert s["reward_info"]["reward"] in (0.0, 1.0)
            ids.add(s["id"])
            call_ids = [tc["id"] for m in s["messages"] for tc in (m.get("tool_calls") or [])]
            assert len(call_ids) == len(set(call_ids))
            calls += len(call_ids)
    lines = Path(meta["jsonl"]).read_text().splitlines()
    assert len(ids) == len(lines) == 30 and calls == meta["tool_calls"] >= 300
    assert {json.loads(line)["episode_id"] for line in lines} == ids
