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


def _run(budget, seed, base, grpo, moe, router=None, target="shop-mixed", **over):
    return {
        "target": target,
        "budget": budget,
        "seed": seed,
        "base": base,
        "grpo_target": grpo,
        "moe": moe,
        "trace": moe,
        "router": router,
        "trace_train": moe + 0.01,
        "moe_train": moe + 0.01,
        "router_train": router,
        "single_best": {"capability": "x", "pass@1": moe - 0.01},
        "spent": {"diagnosis": 100, "calibration": 200, "moe": 32, "total": budget - 8},
        "spent_train": {"training": budget},
        "grpo_constant_groups": 0.5,
        "families_base": {"a": 0.5, "b": 0.0},
        "families_moe": {"a": 0.5, "b": moe},
        **over,
    }


def test_rows_ratio_and_families():
    runs = [_run(640, 0, 0.4, 0.42, 0.46, 0.41), _run(640, 1, 0.4, 0.44, 0.50, 0.43)]
    (row,) = se.budget_rows(runs)
    assert row["rollouts"] == 640 and row["moe"]["mean"] == 0.48 and row["moe"]["runs"] == 2
    assert row["moe"]["std"] == pytest.approx(0.0283, abs=1e-4)
    assert row["single_best"]["mean"] == 0.47 and row["merge"] == {"mean": None, "std": None, "runs": 0}
    # TRACE gained 0.08 over base, GRPO-on-target 0.03; under the training accounting 0.09
    assert row["gain_ratio"] == pytest.approx(0.08 / 0.03, abs=1e-3)
    assert row["gain_ratio_train"] == pytest.approx(0.09 / 0.03, abs=1e-3)
    assert row["spent"]["all"]["mean"] == 632 and row["spent"]["fixed"]["mean"] == 332
    assert row["spent"]["training"]["mean"] == 640 and row["grpo_constant_groups"]["mean"] == 0.5
    assert se.gain_ratio({**row, "grpo_target": {"mean": 0.4}}) is None  # GRPO gained nothing: no ratio
    # the ablations are rows of the largest budget only
    rows = se.budget_rows(runs + [_run(1280, 0, 0.4, 0.45, 0.5)])
    assert rows[0]["single_best"]["runs"] == 0 and rows[1]["single_best"] == {
        "mean": 0.49,
        "std": 0.0,
        "runs": 1,
    }
    fam = se.family_table(runs)
    assert fam["base"] == {"a": 0.5, "b": 0.0} and fam["moe"] == {"a": 0.5, "b": 0.48}


def test_a_run_over_its_budget_is_marked_and_left_out_of_the_ratio():
    runs = [
        _run(640, 0, 0.4, 0.44, 0.46),
        _run(640, 1, 0.4, 0.44, 0.90, over_budget="spent 700 rollouts of 640"),
    ]
    (row,) = se.budget_rows(runs)
    assert row["over_budget_runs"] == 1 and row["trace"]["runs"] == 1 and row["trace"]["mean"] == 0.46
    assert row["gain_ratio"] == pytest.approx(1.5, abs=1e-3)


@pytest.mark.parametrize("fixed", [0, 300, 700, 2600])
def test_planned_steps_stay_within_budget_or_are_marked(fixed):
    """The spend check: under `all`, every TRACE configuration costs at most its budget (the fixed cost, the
    reused calibration episodes already in it, plus what GRPO generates), or is over budget only because the
    fixed cost alone exceeds it; under `training`, GRPO's rollouts (reused ones included) are at most B."""
    per_step, budgets = 32, [640, 1280, 2560]
    reuse = {"a": 4, "b": 0}  # env a's calibration left 4 steps of on-policy episodes
    fixed_parts = {"diagnosis": 100, "calibration": fixed, "moe": 32}
    total_fixed = sum(fixed_parts.values())
    plan = se.plan_steps(budgets, total_fixed, reuse, per_step)
    for B in budgets:
        sp = se.spent(fixed_parts, plan["all"][B], reuse, per_step)
        if total_fixed <= B:
            assert sp["total"] <= B, (B, sp)
            assert (
                B - sp["total"] < 2 * per_step + 2
            )  # and it uses what is left, up to rounding per environment
        else:
            assert sp["total"] > B  # the run is marked over budget
        assert sp["grpo_reused"] <= reuse["a"] * per_step
        tr = se.spent(fixed_parts, plan["training"][B], reuse, per_step)
        assert tr["training"] <= B and B - tr["training"] < 2 * per_step
    # reused episodes are steps that cost nothing more under `all`
    if total_fixed <= 1280:
        assert plan["all"][1280]["a"] - plan["all"][1280]["b"] == 4


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
        "settings": {"budgets": [640]},
        "train_seeds": [seed],
        "commit": "abc",
        "runs": [_run(640, seed, 0.4, grpo, moe, 0.41)],
        "wall_s": 10.0,
        "timings_s": {},
        **over,
    }
    path.write_text(json.dumps(doc))
    return path


def test_combine_merges_per_seed_and_per_method_files(tmp_path):
    a = _result(tmp_path / "a.json", 0, 0.42, 0.46)
    b = _result(tmp_path / "b.json", 1, 0.44, 0.50)
    # seed 1's GRPO-on-target came from another process (--methods grpo_target): its row is merged in
    g = _result(
        tmp_path / "g.json",
        1,
        0.44,
        0.0,
        runs=[{"target": "shop-mixed", "budget": 640, "seed": 1, "grpo_target": 0.44, "base": 0.4}],
    )
    out = tmp_path / "all.json"
    proc = _bench("--combine", str(a), str(b), str(g), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["train_seeds"] == [0, 1] and len(res["runs"]) == 2 and res["commit"] == "abc"
    row = res["targets"]["shop-mixed"]["budgets"][0]
    assert row["trace"]["mean"] == 0.48 and row["gain_ratio"] == pytest.approx(2.667, abs=1e-3)
    assert {"rollouts", "base", "grpo_target", "trace", "router", "merge", "spent", "gain_ratio"} <= set(row)
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "gain ratio" in proc.stdout and "2.67x" in proc.stdout
    # result files of different experiments are not combined
    c = _result(tmp_path / "c.json", 2, 0.4, 0.4, held_out="0:200")
    bad = _bench("--combine", str(a), str(c), "--out", str(tmp_path / "x.json"))
    assert bad.returncode != 0 and "held_out differs" in bad.stderr and not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path):
    """Every method at two budgets on 10 held-out seeds of shop-mixed (tiny budgets: correctness, not a result)."""
    out = tmp_path / "se.json"
    proc = _bench(
        "--target",
        "shop-mixed",
        "--train-seeds",
        "0",
        "--budgets",
        "64,128",
        "--held-out",
        "500000:500010",
        "--validation",
        "600000:600005",
        "--diagnosis-rollouts",
        "40",
        "--calibration",
        "4x8",
        "--calibration-look",
        "0",
        "--calibration-attempts",
        "1",
        "--moe-seeds",
        "2",
        "--moe-steps",
        "5",
        "--episodes-per-step",
        "16",
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(out),
        timeout=2400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["commit"] and res["command"].startswith("python") and res["settings"]["budgets"] == [64, 128]
    rows = res["targets"]["shop-mixed"]["budgets"]
    assert [r["rollouts"] for r in rows] == [64, 128]
    for r in rows:
        for m in ("base", "grpo_target"):
            assert r[m]["runs"] == 1 and 0.0 <= r[m]["mean"] <= 1.0, (m, r)
    runs = {r["budget"]: r for r in res["runs"]}
    # one GRPO run gives both budgets: the smaller is a snapshot of the larger
    assert runs[64]["grpo_rollouts"] == 64 and runs[128]["grpo_rollouts"] == 128
    top = runs[128]
    assert top["spent"]["diagnosis"] == 40 and top["selected"]
    # every calibration ran on the base agent; its rollouts are charged whether it passed or not
    assert top["spent"]["calibration"] >= 32 * (len(top["environments"]) + len(top["calibration_failed"]) > 0)
    if top["environments"]:
        assert top["spent"]["total"] > 128 or not top.get(
            "over_budget"
        )  # tiny budgets: the fixed cost is over
        assert "trace_train" in top and top["spent_train"]["training"] <= 128
    assert set(res["targets"]["shop-mixed"]["families_at_largest_budget"]["base"]) >= {
        "shop-mixed-cancel_order"
    }


def test_methods_option():
    assert se.parse_args(["--methods", "trace"]).methods == ["trace"]
    assert se.parse_args([]).methods == ["grpo_target", "trace"]
    with pytest.raises(SystemExit):
        se.parse_args(["--methods", "trace,gepa"])
