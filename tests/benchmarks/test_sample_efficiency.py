"""benchmarks/sample_efficiency.py: the table's arithmetic (mean ± std over training seeds, the gain ratio, the
one-expert ablation), `--combine` of per-seed result files, and (slow) a tiny end-to-end run on the demo base."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import sample_efficiency as se  # noqa: E402


def _run(budget, seed, base, grpo, moe, router=None):
    return {
        "budget": budget,
        "seed": seed,
        "base": base,
        "grpo_target": grpo,
        "moe": moe,
        "trace": moe,
        "router": router,
        "single_best": {"capability": "x", "pass@1": moe - 0.01},
        "families_base": {"a": 0.5, "b": 0.0},
        "families_moe": {"a": 0.5, "b": moe},
    }


def test_rows_ratio_and_families():
    runs = [_run(512, 0, 0.4, 0.42, 0.46, 0.41), _run(512, 1, 0.4, 0.44, 0.50, 0.43)]
    (row,) = se.budget_rows(runs)
    assert row["rollouts"] == 512 and row["moe"]["mean"] == 0.48 and row["moe"]["runs"] == 2
    assert row["moe"]["std"] == pytest.approx(0.0283, abs=1e-4)
    assert row["single_best"]["mean"] == 0.47 and row["merge"] == {"mean": None, "std": None, "runs": 0}
    # TRACE gained 0.08 over base, GRPO-on-target 0.03
    assert se.gain_ratio(row) == pytest.approx(0.08 / 0.03, abs=1e-3)
    assert se.gain_ratio({**row, "grpo_target": {"mean": 0.4}}) is None  # GRPO gained nothing: no ratio
    # the ablations are rows of the largest budget only
    rows = se.budget_rows(runs + [_run(1024, 0, 0.4, 0.45, 0.5)])
    assert rows[0]["single_best"]["runs"] == 0 and rows[1]["single_best"] == {
        "mean": 0.49,
        "std": 0.0,
        "runs": 1,
    }
    fam = se.family_table(runs)
    assert fam["base"] == {"a": 0.5, "b": 0.0} and fam["moe"] == {"a": 0.5, "b": 0.48}


def test_one_expert_ablation():
    base = {"t1": False, "t2": False, "t3": True, "t4": False}
    experts = {
        "p": {"solved": {"t1": True, "t2": True, "t3": True, "t4": False}},
        "m": {"solved": {"t1": False, "t2": True, "t3": True, "t4": False}},
    }
    comps = {
        "moe": {"solved": {"t1": True, "t2": True}},
        "merge": {"solved": {"t1": False, "t2": True}},
    }
    # t1: only p solves it (t2: both; t3: the base does; t4: nobody)
    assert se.one_expert_ablation(base, experts, comps) == {
        "one_expert_tasks": 1,
        "by_expert": {"p": 1, "m": 0},
        "kept": {"moe": 1, "merge": 0},
    }


def _bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """benchmarks/sample_efficiency.py with these arguments, in a subprocess."""
    script = REPO / "benchmarks" / "sample_efficiency.py"
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
    )


def _result(path: Path, seed: int, grpo: float, moe: float, **over) -> Path:
    doc = {
        "held_out": "500000:500200",
        "settings": {"budgets": [512]},
        "train_seeds": [seed],
        "runs": [_run(512, seed, 0.4, grpo, moe, 0.41)],
        "wall_s": 10.0,
        "timings_s": {},
        **over,
    }
    path.write_text(json.dumps(doc))
    return path


def test_combine_merges_per_seed_files(tmp_path):
    a = _result(tmp_path / "a.json", 0, 0.42, 0.46)
    b = _result(tmp_path / "b.json", 1, 0.44, 0.50)
    out = tmp_path / "all.json"
    proc = _bench("--combine", str(a), str(b), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["train_seeds"] == [0, 1] and len(res["runs"]) == 2
    assert res["budgets"][0]["trace"]["mean"] == 0.48 and res["gain_ratio"]["512"] == pytest.approx(
        2.667, abs=1e-3
    )
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "gain ratio" in proc.stdout and "2.67x" in proc.stdout
    # result files of different experiments are not combined
    c = _result(tmp_path / "c.json", 2, 0.4, 0.4, held_out="0:200")
    bad = _bench("--combine", str(a), str(c), "--out", str(tmp_path / "x.json"))
    assert bad.returncode != 0 and "held_out differs" in bad.stderr and not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path):
    """Every method at two budgets on 20 held-out seeds (tiny budgets: correctness, not a result)."""
    out = tmp_path / "se.json"
    proc = _bench(
        "--train-seeds",
        "0",
        "--budgets",
        "128,192",
        "--held-out",
        "500000:500020",
        "--diagnosis-rollouts",
        "60",
        "--calibration",
        "4x4",
        "--calibration-attempts",
        "1",
        "--moe-seeds",
        "4",
        "--episodes-per-step",
        "16",
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(out),
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["rollouts"] for r in res["budgets"]] == [128, 192]
    for r in res["budgets"]:
        for m in ("base", "grpo_target", "trace", "router", "moe"):
            assert r[m]["runs"] == 1 and 0.0 <= r[m]["mean"] <= 1.0, (m, r)
    runs = {r["budget"]: r for r in res["runs"]}
    # one GRPO run gives both budgets: the smaller is a snapshot of the larger
    assert runs[128]["grpo_rollouts"] == 128 and runs[192]["grpo_rollouts"] == 192
    assert runs[192]["spent"]["diagnosis"] == 60 and runs[192]["selected"]
    assert set(res["families_at_largest_budget"]["base"]) >= {"shop-cancel_order", "shop-multi_op"}


def test_methods_option():
    assert se.parse_args(["--methods", "trace"]).methods == ["trace"]
    assert se.parse_args([]).methods == ["grpo_target", "trace"]
    with pytest.raises(SystemExit):
        se.parse_args(["--methods", "trace,gepa"])
