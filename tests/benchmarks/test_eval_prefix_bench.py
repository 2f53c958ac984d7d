"""benchmarks/eval_prefix_bench.py on the session's tiny model (correctness only, no timing asserts): the
cache-off and cache-on eval runs give the same outcomes, and only the cache-on ones are served by the cache."""

from __future__ import annotations

import json

import pytest
import tinymodel


def test_eval_prefix_bench_smoke(tmp_path_factory, tmp_path, capsys):
    import eval_prefix_bench

    tiny = tinymodel.tiny(tmp_path_factory)
    out = tmp_path / "bench.json"
    args = ["--model", str(tiny.hf), "--episodes", "3", "--batch-sizes", "1", "3"]
    rc = eval_prefix_bench.main([*args, "--max-new-tokens", "4", "--max-turns", "2", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert [(r["batch_size"], r["prefix_cache"]) for r in rows] == [
        (1, False),
        (1, True),
        (3, False),
        (3, True),
    ]
    assert doc["same_outcomes"] and all(r["same_outcomes"] for r in rows)
    assert set(doc["prefix_cache_speedup"]) == {"1", "3"} and doc["commit"]
    for r in rows:
        assert r["episodes"] == 3 and r["turns"] >= 3 and r["s_per_episode"] > 0
        assert (r["prefix_hit_tokens"] > 0) == r["prefix_cache"]
        assert r["prefill_s_per_episode"] > 0 and r["decode_s_per_episode"] > 0 and r["bound_x"] >= 1
    off, on = rows[2], rows[3]  # all three episodes start together: their shared prompt is prefilled once
    assert on["prefill_tokens_per_turn"] < off["prefill_tokens_per_turn"]
    assert "prefill tok/turn" in capsys.readouterr().out


def test_bad_arguments_exit_2():
    import eval_prefix_bench

    with pytest.raises(SystemExit) as e:
        eval_prefix_bench.parse_args(["--batch-sizes", "0"])
    assert e.value.code == 2
