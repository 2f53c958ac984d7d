"""Rewards must be finite and in [0, 1] (issue 14): NaN, Infinity, 7.5 and -3 are record errors, in τ²-bench
results and in JSONL episodes; nothing is written, and with --on-error skip the mean stays a number."""

from __future__ import annotations

import json
import math

import pytest
from trace_testing import TAU2_DIR, TAU2_FILES, episode, run_trace, snapshot, write_jsonl

BAD = [("NaN", "nan is not a finite number"), ("Infinity", "inf"), ("7.5", "7.5"), ("-3", "-3")]


@pytest.mark.parametrize("raw, msg", BAD)
def test_bad_reward_in_jsonl(tmp_path, raw, msg):
    store = tmp_path / "store"
    assert (
        run_trace(
            "ingest", "jsonl", write_jsonl(tmp_path / "ok.jsonl", [episode("ok")]), "--store", store
        ).returncode
        == 0
    )
    good = json.dumps(episode("e1"))
    bad = json.dumps(episode("e2", reward=0.5)).replace('"reward": 0.5', f'"reward": {raw}')
    f = write_jsonl(tmp_path / "e.jsonl", [good, bad])
    before = snapshot(store)
    r = run_trace("ingest", "jsonl", f, "--store", store)
    assert r.returncode == 2, r.stderr
    assert "line 2 (episode_id e2): reward:" in r.stderr and msg in r.stderr, r.stderr
    assert "internal error" not in r.stderr
    assert snapshot(store) == before
    # --on-error skip keeps the good record; the mean is a number
    r = run_trace("ingest", "jsonl", f, "--on-error", "skip", "--store", store)
    assert r.returncode == 0, r.stderr
    q = run_trace(
        "store", "sql", "SELECT count(*) AS n, avg(reward) AS r FROM episodes", "--json", "--store", store
    )
    (row,) = json.loads(q.stdout)
    assert row["n"] == 2 and math.isfinite(row["r"]) and row["r"] == 1.0


@pytest.mark.parametrize("raw, msg", BAD)
def test_bad_reward_in_tau2_results(tmp_path, raw, msg):
    doc = json.loads((TAU2_DIR / TAU2_FILES["telecom"]).read_text())
    sim = doc["simulations"][3]
    sim["reward_info"]["reward"] = 0.123456
    text = json.dumps(doc).replace("0.123456", raw, 1)
    f = tmp_path / "results.json"
    f.write_text(text)
    store = tmp_path / "store"
    r = run_trace("ingest", "tau2", f, "--store", store)
    assert r.returncode == 2, r.stderr
    assert f"simulations[3] (id {sim['id']}): reward_info.reward:" in r.stderr and msg in r.stderr, r.stderr
    assert "internal error" not in r.stderr and not store.exists()


@pytest.mark.parametrize("reward", [0, 0.0, 0.5, 1, 1.0])
def test_rewards_at_and_inside_the_bounds_are_accepted(tmp_path, reward):
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1", reward=reward)])
    r = run_trace("ingest", "jsonl", f, "--store", tmp_path / "store")
    assert r.returncode == 0, r.stderr
