"""benchmarks/train_bench.py runs end to end at a tiny size (correctness only, no timing asserts)."""

from __future__ import annotations

import json
import sys

import pytest
from trace_testing import REPO, run_benchmark


@pytest.mark.slow
def test_train_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    work = tmp_path / "work"
    proc = run_benchmark(
        "train_bench.py", "--quick", "--multi-turn-turns", "0", "--workdir", work, "--out", out
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for side in ("trace", "bare_trl"):
        assert res[side]["runs"] and res[side]["runs"][0]["steps"] == 2
        assert res[side]["tokens_per_s"] > 0
    assert set(res["ratio"]) >= {"steps_per_s", "tokens_per_s", "cpu_steps_per_s", "cpu_tokens_per_s"}
    assert "ratio trace / bare" in proc.stdout


def _bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import train_bench

    return train_bench


def test_smollm2_mode_arithmetic_and_table(capsys):
    """--model smollm2: seconds per episode split into rollout and training, the speed-up, the goal line."""
    tb = _bench()
    run = {
        "label": "before",
        "train_s": 80.0,
        "train_cpu_s": 40.0,
        "rollout_s": 20.0,
        "rollout_cpu_s": 10.0,
        "episodes": 4,
        "episode_tokens": [900, 1100, 1000, 1000],
        "max_rss_gib": 3.0,
        "settings": {"per_device_batch_size": 2, "gradient_checkpointing": True, "precision": "fp32"},
    }
    pe = tb.per_episode(run)
    assert pe["s_per_episode"] == 20.0 and pe["cpu_s_per_episode"] == 10.0
    assert pe["rollout_cpu_s_per_episode"] == 2.5 and pe["train_cpu_s_per_episode"] == 7.5
    assert pe["train_s_per_episode"] == 15.0 and pe["episode_tokens"] == 1000
    after = {**run, **{"label": "after", "train_s": 32.0, "train_cpu_s": 16.0}}
    runs = [{**run, **pe}, {**after, **tb.per_episode(after)}]
    res = {
        "params": {"episodes": 4, "num_generations": 4, "tokens": 128, "threads": 1},
        "goal_s_per_episode": 10.0,
        "runs": runs,
        "speedup": {"s_per_episode": 2.5},
        "meets_goal": runs[1]["s_per_episode"] <= 10.0,
    }
    tb.print_smollm2(res)
    out = capsys.readouterr().out
    assert "before (micro 2, gc on, fp32)" in out and "2.50x" in out
    assert "goal <= 10 s/episode: met (after: 8.0 s wall" in out


def test_smollm2_before_tree_is_the_ref_exported(tmp_path):
    tb = _bench()
    src = tb.export_tree("HEAD", tmp_path / "src")
    assert (src / "trace_cli" / "training" / "grpo.py").is_file()
    assert (src / "schemas" / "config" / "train.v1.json").is_file()
    assert (
        src / "trace_cli" / "schemas" / "config" / "train.v1.json"
    ).is_file()  # the package's link resolves
