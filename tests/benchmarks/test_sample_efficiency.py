"""benchmarks/sample_efficiency.py and its library benchmarks/se/: the table's arithmetic (mean ± std over training
seeds, the gain ratio, the one-expert ablation), the paired bootstrap on per-task outcomes with a known answer,
`--combine` of per-seed result files (refusing a dirty run, keeping every run's commit), resuming a stopped run
from OUT.partial.json, and (slow) a tiny end-to-end run on the demo base."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from se import methods, plan, results, settings, stats


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
    (row,) = stats.budget_rows(runs)
    assert row["rollouts"] == 640 and row["moe"]["mean"] == 0.48 and row["moe"]["runs"] == 2
    assert row["moe"]["std"] == pytest.approx(0.0283, abs=1e-4)
    assert row["single_best"]["mean"] == 0.47 and row["merge"] == {"mean": None, "std": None, "runs": 0}
    # TRACE gained 0.08 over base, GRPO-on-target 0.03; under the training accounting 0.09
    assert row["gain_ratio"] == pytest.approx(0.08 / 0.03, abs=1e-3)
    assert row["gain_ratio_train"] == pytest.approx(0.09 / 0.03, abs=1e-3)
    assert row["spent"]["all"]["mean"] == 632 and row["spent"]["fixed"]["mean"] == 332
    assert row["spent"]["training"]["mean"] == 640 and row["grpo_constant_groups"]["mean"] == 0.5
    assert stats.gain_ratio({**row, "grpo_target": {"mean": 0.4}}) is None  # GRPO gained nothing: no ratio
    # the ablations are rows of the largest budget only
    rows = stats.budget_rows(runs + [_run(1280, 0, 0.4, 0.45, 0.5)])
    assert rows[0]["single_best"]["runs"] == 0 and rows[1]["single_best"] == {
        "mean": 0.49,
        "std": 0.0,
        "runs": 1,
    }
    fam = stats.family_table(runs)
    assert fam["base"] == {"a": 0.5, "b": 0.0} and fam["moe"] == {"a": 0.5, "b": 0.48}


def test_a_run_over_its_budget_is_marked_and_left_out_of_the_ratio():
    runs = [
        _run(640, 0, 0.4, 0.44, 0.46),
        _run(640, 1, 0.4, 0.44, 0.90, over_budget="spent 700 rollouts of 640"),
    ]
    (row,) = stats.budget_rows(runs)
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
    steps = plan.plan_steps(budgets, total_fixed, reuse, per_step)
    for B in budgets:
        sp = plan.spent(fixed_parts, steps["all"][B], reuse, per_step)
        if total_fixed <= B:
            assert sp["total"] <= B, (B, sp)
            assert (
                B - sp["total"] < 2 * per_step + 2
            )  # and it uses what is left, up to rounding per environment
        else:
            assert sp["total"] > B  # the run is marked over budget
        assert sp["grpo_reused"] <= reuse["a"] * per_step
        tr = plan.spent(fixed_parts, steps["training"][B], reuse, per_step)
        assert tr["training"] <= B and B - tr["training"] < 2 * per_step
    # reused episodes are steps that cost nothing more under `all`
    if total_fixed <= 1280:
        assert steps["all"][1280]["a"] - steps["all"][1280]["b"] == 4


@pytest.mark.parametrize("fixed", [0, 300, 700])
def test_validation_episodes_are_planned_and_charged(fixed):
    """Early stopping's validation episodes (16 seeds before step 1 and every 4 steps) come out of the budget
    under `all`: planned so that GRPO + validation fit, and charged in `spent` (not under `training`)."""
    per_step, budgets, val = 32, [640, 1280, 2560], (4, 16)
    reuse = {"a": 4, "b": 0}
    fixed_parts = {"diagnosis": 100, "calibration": fixed, "moe": 32}
    total_fixed = sum(fixed_parts.values())
    plain = plan.plan_steps(budgets, total_fixed, reuse, per_step)
    steps = plan.plan_steps(budgets, total_fixed, reuse, per_step, val)
    for B in budgets:
        charged = {c: plan.validation_episodes(k, *val) for c, k in steps["all"][B].items()}
        sp = plan.spent(fixed_parts, steps["all"][B], reuse, per_step, charged)
        assert sp["validation"] == sum(charged.values()) > 0
        if total_fixed <= B:
            assert sp["total"] <= B, (B, sp)
            assert B - sp["total"] < 2 * (per_step + 16) + 2
            assert all(
                steps["all"][B][c] < plain["all"][B][c] for c in reuse if plain["all"][B][c] > reuse[c] + 1
            )
        assert steps["training"][B] == plain["training"][B]
    assert plan.validation_episodes(9, 4, 16) == 48 and plan.validation_episodes(9, 4, 0) == 0


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
    assert stats.one_expert_ablation(base, experts, comps) == {
        "one_expert_tasks": 1,
        "by_expert": {"p": 1, "m": 0},
        "kept": {"moe": 1, "merge": 0},
    }


def _result(path: Path, seed: int, grpo: float, moe: float, runs=None, **over) -> Path:
    """A result file of one process, written by the benchmark's own writer (checked against its schema)."""
    runs = runs or [_run(640, seed, 0.4, grpo, moe, 0.41)]
    doc = {
        "benchmark": "sample_efficiency",
        "commit": "abc",
        "dirty": False,
        "command": "python benchmarks/sample_efficiency.py",
        "held_out": "500000:500200",
        "settings": {"budgets": [640], "episodes_per_step": 32, "learning_rate": 0.002},
        "train_seeds": [seed],
        "targets": stats.summarize(runs),
        "runs": runs,
        "wall_s": 10.0,
        "timings_s": {},
        **over,
    }
    return results.write(path, doc)


def test_combine_merges_per_seed_and_per_method_files(tmp_path, run_benchmark):
    a = _result(tmp_path / "a.json", 0, 0.42, 0.46)
    b = _result(tmp_path / "b.json", 1, 0.44, 0.50, commit="def")
    # seed 1's GRPO-on-target came from another process (--methods grpo_target): its row is merged in
    g_run = {"target": "shop-mixed", "budget": 640, "seed": 1, "grpo_target": 0.44, "base": 0.4}
    g = _result(tmp_path / "g.json", 1, 0.44, 0.0, runs=[g_run], commit="fed")
    out = tmp_path / "all.json"
    proc = run_benchmark("sample_efficiency.py", "--combine", str(a), str(b), str(g), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = results.read(out)  # the combined file conforms to its schema
    assert res["train_seeds"] == [0, 1] and len(res["runs"]) == 2 and res["commit"] == "abc"
    row = res["targets"]["shop-mixed"]["budgets"][0]
    assert row["trace"]["mean"] == 0.48 and row["gain_ratio"] == pytest.approx(2.667, abs=1e-3)
    assert {"rollouts", "base", "grpo_target", "trace", "router", "merge", "spent", "gain_ratio"} <= set(row)
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "gain ratio" in proc.stdout and "2.67x" in proc.stdout
    # every file's commit and dirty flag is kept, and each row says which files it came from
    assert res["dirty"] is False and res["commits"] == ["abc", "def", "fed"]
    assert [(x["file"], x["commit"], x["dirty"]) for x in res["sources"]] == [
        (str(a), "abc", False),
        (str(b), "def", False),
        (str(g), "fed", False),
    ]
    seed1 = next(r for r in res["runs"] if r["seed"] == 1)
    assert [x["commit"] for x in seed1["sources"]] == ["def", "fed"]
    # the checkout that combined them is named (from git when --combine wrote), beside the runs' commits
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=results.REPO, capture_output=True, text=True)
    assert res["combined_by"]["commit"] == head.stdout.strip() != "abc"
    assert isinstance(res["combined_by"]["dirty"], bool) and res["combined_by"]["at"].endswith("Z")


def test_combine_refuses_a_dirty_run_and_other_experiments(tmp_path, run_benchmark):
    a = _result(tmp_path / "a.json", 0, 0.42, 0.46)
    dirty = _result(tmp_path / "d.json", 1, 0.44, 0.50, dirty=True, commit="0123")
    unknown = _result(tmp_path / "u.json", 1, 0.44, 0.50, dirty=None)
    other = _result(tmp_path / "c.json", 2, 0.4, 0.4, held_out="0:200")
    not_a_result = tmp_path / "n.json"
    not_a_result.write_text(json.dumps({"budgets": []}))
    for bad, reason in (
        (dirty, f"{dirty} is the result of a dirty checkout (commit 0123)"),
        (unknown, "a checkout whose state it does not record"),
        (other, "held_out differs"),
        (not_a_result, "not a sample_efficiency file"),
    ):
        out = tmp_path / "x.json"
        proc = run_benchmark("sample_efficiency.py", "--combine", str(a), str(bad), "--out", str(out))
        assert proc.returncode == 2 and reason in proc.stderr, proc.stderr[-2000:]
        assert not out.exists() and not out.with_suffix(".png").exists()


def _outcomes(values) -> dict[str, float]:
    return {f"shop-mixed-x-{i}": v for i, v in enumerate(values)}


def _paired(seed, base, grpo, trace, budget=640):
    return {
        "budget": budget,
        "seed": seed,
        "tasks_base": _outcomes(base),
        "tasks_grpo_target": _outcomes(grpo),
        "tasks_trace": _outcomes(trace),
    }


def test_bootstrap_constant_gains_give_a_point_interval():
    """Every task: base 0, GRPO 0.5, TRACE 1.0; whatever is resampled, the difference is 0.5 and the ratio 2."""
    n = 50
    runs = [_paired(s, [0.0] * n, [0.5] * n, [1.0] * n) for s in (0, 1, 2)]
    b = stats.paired_bootstrap(runs, samples=500)
    assert b["seeds"] == [0, 1, 2] and b["tasks"] == n and b["trace_gain"] == 1.0 and b["grpo_gain"] == 0.5
    assert b["difference"] == {"mean": 0.5, "lower_90": 0.5, "interval_90": [0.5, 0.5]}
    assert b["ratio"] == {"mean": 2.0, "interval_95": [2.0, 2.0], "ratio_undefined": 0.0}


def test_bootstrap_resamples_the_training_seeds():
    """Two seeds, identical tasks within a seed: TRACE gains 0.6 with seed 0 and 0.2 with seed 1, GRPO 0.2 with
    both. Resampling the seeds gives differences 0.4 / 0.2 / 0.0 with probabilities 1/4, 1/2, 1/4 (ratios 3, 2,
    1): the 10th percentile of the difference is 0 and the ratio's 95 % interval [1, 3]; resampling the tasks
    alone would give a point."""
    n = 40
    runs = [_paired(0, [0.0] * n, [0.2] * n, [0.6] * n), _paired(1, [0.0] * n, [0.2] * n, [0.2] * n)]
    b = stats.paired_bootstrap(runs, samples=4000)
    assert b["difference"]["mean"] == 0.2 and b["difference"]["lower_90"] == 0.0
    assert b["difference"]["interval_90"] == [0.0, 0.4]
    assert b["ratio"]["mean"] == 2.0 and b["ratio"]["interval_95"] == [1.0, 3.0]


def test_bootstrap_over_tasks_matches_the_normal_approximation():
    """One seed, 400 tasks: TRACE solves 100 tasks GRPO does not, the other 300 alike; the difference is a
    binomial proportion 0.25 with standard error sqrt(0.25 * 0.75 / 400): its 10th percentile is about
    0.25 - 1.2816 SE. GRPO gains 0.25 on every task, so the ratio is 1 + difference / 0.25."""
    n, k = 400, 100
    base = [0.0] * n
    grpo = [0.25] * n
    trace = [1.25 if i < k else 0.25 for i in range(n)]  # outcomes need not be 0/1: a mean over trials
    trace = [min(v, 1.0) for v in trace]  # 1.0 on the first k tasks: TRACE - GRPO = 0.75 there
    b = stats.paired_bootstrap([_paired(0, base, grpo, trace)], samples=20000)
    diff = 0.75 * k / n
    se_diff = 0.75 * (k / n * (1 - k / n) / n) ** 0.5
    assert b["difference"]["mean"] == pytest.approx(diff)
    assert b["difference"]["lower_90"] == pytest.approx(diff - 1.2816 * se_diff, abs=0.004)
    lo, hi = b["ratio"]["interval_95"]
    assert lo == pytest.approx(1 + (diff - 1.96 * se_diff) / 0.25, abs=0.03)
    assert hi == pytest.approx(1 + (diff + 1.96 * se_diff) / 0.25, abs=0.03)


def test_bootstrap_needs_per_task_outcomes_of_both_methods():
    runs = [_paired(0, [0.0], [0.5], [1.0])]
    del runs[0]["tasks_trace"]
    assert stats.paired_bootstrap(runs) is None
    over = [{**_paired(0, [0.0], [0.5], [1.0]), "over_budget": "spent 700 of 640"}]
    assert stats.paired_bootstrap(over) is None  # TRACE over its budget is out, as in the table


def test_bootstrap_is_stored_and_printed(tmp_path, run_benchmark):
    """--combine computes the bootstrap of the runs' per-task outcomes, stores it per budget and prints it."""
    n = 30
    paths = []
    for seed, gain in ((0, 0.6), (1, 0.4)):
        tasks = {
            "tasks_base": _outcomes([0.0] * n),
            "tasks_grpo_target": _outcomes([0.2] * n),
            "tasks_trace": _outcomes([gain] * n),
        }
        run = _run(640, seed, 0.0, 0.2, gain, 0.1, **tasks)
        paths.append(_result(tmp_path / f"{seed}.json", seed, 0.2, gain, runs=[run]))
    out = tmp_path / "all.json"
    proc = run_benchmark("sample_efficiency.py", "--combine", *map(str, paths), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    boot = results.read(out)["targets"]["shop-mixed"]["bootstrap"]["640"]
    assert boot["seeds"] == [0, 1] and boot["difference"]["mean"] == 0.3 and boot["ratio"]["mean"] == 2.5
    assert boot["ratio"]["interval_95"] == [2.0, 3.0] and boot["difference"]["lower_90"] == 0.2
    assert "paired bootstrap" in proc.stdout and "[2.00, 3.00]" in proc.stdout


def _meta(**over):
    return {
        "commit": "abc",
        "dirty": False,
        "command": "python benchmarks/sample_efficiency.py",
        "held_out": "500000:500010",
        "settings": {"budgets": [64, 128]},
        "targets_run": ["shop-mixed"],
        **over,
    }


def test_a_stopped_run_resumes_the_units_it_finished(tmp_path):
    """Progress writes OUT.partial.json after each (target, seed, method); a new process with the same commit
    and settings takes the finished units from it and computes only the others; another commit, other settings
    or another checkout state (dirty instead of clean) start over."""
    path = tmp_path / "se.partial.json"
    calls = []

    def unit(seed, pass1):
        calls.append(seed)
        return {64: {"grpo_target": pass1, "tasks_grpo_target": {"t-1": pass1}}, 128: {"grpo_target": pass1}}

    first = results.Progress(path, _meta())
    first.unit("shop-mixed", 0, "grpo_target", unit, 0, 0.25)
    assert calls == [0] and results.read(path, results.PARTIAL)["done"] == [["shop-mixed", 0, "grpo_target"]]
    # the process is killed here; the same command again:
    again = results.Progress(path, _meta())
    rows = again.unit("shop-mixed", 0, "grpo_target", unit, 0, 0.99)
    assert calls == [0] and rows == {
        64: {"grpo_target": 0.25, "tasks_grpo_target": {"t-1": 0.25}},
        128: {"grpo_target": 0.25},
    }
    again.unit("shop-mixed", 1, "grpo_target", unit, 1, 0.5)
    assert calls == [0, 1] and len(results.read(path, results.PARTIAL)["done"]) == 2
    for changed in ({"commit": "def"}, {"settings": {"budgets": [64]}}, {"dirty": True}):
        calls.clear()
        fresh = results.Progress(path, _meta(**changed))
        fresh.unit("shop-mixed", 0, "grpo_target", unit, 0, 0.5)
        assert calls == [0], changed
    again.finished()
    assert not path.exists()


def test_every_restart_is_logged_with_its_reason(tmp_path):
    """A process started over an existing OUT.partial.json appends a restart (time, commit, reason, resumed,
    units done) to the partial file at once; earlier restarts are kept; one that cannot resume says why; a first
    start logs nothing; --combine keeps the restarts of every file."""
    path = tmp_path / "se.partial.json"

    def unit(seed):
        return {64: {"grpo_target": 0.5}, 128: {"grpo_target": 0.5}}

    first = results.Progress(path, _meta())
    assert "restarts" not in first.meta
    first.unit("shop-mixed", 0, "grpo_target", unit, 0)
    assert "restarts" not in results.read(path, results.PARTIAL)
    results.Progress(path, _meta(), "machine stopped")  # killed before its next unit
    logged = results.read(path, results.PARTIAL)["restarts"]
    assert [(r["reason"], r["resumed"], r["units_done"], r["commit"]) for r in logged] == [
        ("machine stopped", True, 1, "abc")
    ]
    third = results.Progress(path, _meta())
    third.unit("shop-mixed", 1, "grpo_target", unit, 1)
    logged = results.read(path, results.PARTIAL)["restarts"]
    assert [(r["reason"], r["units_done"]) for r in logged] == [("machine stopped", 1), ("not given", 1)]
    assert third.meta["restarts"] == logged  # what the result will carry
    other = results.Progress(path, _meta(commit="def"), "new commit")
    logged = results.read(path, results.PARTIAL)["restarts"]
    assert logged[-1]["resumed"] is False and logged[-1]["reason"] == "new commit"
    assert "commit" in logged[-1]["not_resumed_because"] and other.done == {}


def test_combine_keeps_every_files_restarts(tmp_path, run_benchmark):
    r = {"at": "2026-12-06T05:00:00Z", "commit": "abc", "reason": "oom", "resumed": True, "units_done": 0}
    a = _result(tmp_path / "a.json", 0, 0.42, 0.46, restarts=[r])
    b = _result(tmp_path / "b.json", 1, 0.44, 0.50)
    out = tmp_path / "all.json"
    proc = run_benchmark("sample_efficiency.py", "--combine", str(a), str(b), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert results.read(out)["restarts"] == [r]


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path, run_benchmark):
    """Every method at two budgets on 10 held-out seeds of shop-mixed (tiny budgets: correctness, not a result)."""
    out = tmp_path / "se.json"
    proc = run_benchmark(
        "sample_efficiency.py",
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
    # every method's outcome on every test task is kept (the paired analysis), and single_best's validation
    # rollouts are charged to it
    assert len(top["tasks_base"]) == len(top["tasks_grpo_target"]) == 10
    if top["environments"]:
        assert len(top["tasks_trace"]) == len(top["tasks_single_best"]) == 10
        assert top["spent_single_best"]["validation"] == 5 * len(top["environments"])
    assert set(res["targets"]["shop-mixed"]["bootstrap"]) == {"64", "128"}


def test_settings_from_the_command_line():
    s = settings.parse_settings(["--methods", "trace", "--quick", "--held-out", "7:9"], "doc")
    assert s.methods == ("trace",) and s.budgets == (640, 1280) and s.held_out == "7:9" and s.cal_seeds == 16
    assert s.out.name == "sample_efficiency_mixed_quick.json" and s.plot == s.out.with_suffix(".png")
    assert s.record()["budgets"] == [640, 1280] and "out" not in s.record()
    full = settings.parse_settings([], "doc")
    assert full.methods == ("grpo_target", "trace") and full.train_seeds == (0, 1, 2)
    with pytest.raises(AttributeError):  # frozen
        full.budgets = (1,)  # type: ignore[misc]
    for bad in (["--methods", "trace,gepa"], ["--target", "airline"], ["--budgets", "6x"]):
        with pytest.raises(SystemExit) as e:
            settings.parse_settings(bad, "doc")
        assert e.value.code == 2


@pytest.mark.slow
def test_a_killed_run_resumes_where_it_stopped(tmp_path, run_benchmark):
    """GRPO-on-target for training seeds 0 and 1 at a tiny budget in one process, killed once seed 0 is in
    OUT.partial.json: the same command again takes seed 0 from there, runs only seed 1, and writes the result."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "se.json"
    partial = out.with_suffix(".partial.json")
    args = [
        *("--target", "shop-mixed", "--methods", "grpo_target", "--train-seeds", "0,1", "--budgets", "16"),
        *("--episodes-per-step", "8", "--num-generations", "4", "--held-out", "500000:500004"),
        *("--store", str(tmp_path / "store"), "--out", str(out)),
    ]
    script = str(Path(results.REPO) / "benchmarks" / "sample_efficiency.py")
    first = subprocess.Popen(
        [sys.executable, script, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 1200
        while not partial.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, "the run ended before it could be stopped"
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait()
    assert [tuple(u) for u in results.read(partial, results.PARTIAL)["done"]] == [
        ("shop-mixed", 0, "grpo_target")
    ]
    seed0 = next(r["row"] for r in results.read(partial, results.PARTIAL)["runs"] if r["seed"] == 0)
    proc = run_benchmark("sample_efficiency.py", *args, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shop-mixed/grpo_target/0: done in se.partial.json, not run again" in proc.stderr
    assert (
        "shop-mixed/grpo_target/0: train" not in proc.stderr
        and "shop-mixed/grpo_target/1: train" in proc.stderr
    )
    res = results.read(out)
    by_seed = {r["seed"]: r for r in res["runs"]}
    assert set(by_seed) == {0, 1} and not partial.exists()
    assert by_seed[0]["tasks_grpo_target"] == seed0["tasks_grpo_target"] and seed0["grpo_rollouts"] == 16
    assert len(by_seed[1]["tasks_grpo_target"]) == 4 and len(by_seed[1]["tasks_base"]) == 4


def test_the_moe_is_charged_what_its_composition_generated():
    sp = {"diagnosis": 100, "calibration": 0, "moe": 0, "total": 700}
    methods.charge_moe(sp, {"routing": {"generated_episodes": 0}})
    assert sp["moe"] == 0 and sp["total"] == 700  # own training episodes + the diagnosis: nothing new
    methods.charge_moe(sp, {"routing": {"generated_episodes": 24}})
    assert sp["moe"] == 24 and sp["total"] == 724


def test_learning_rate_one_for_both_or_one_per_method():
    assert settings.parse_settings([], "doc").learning_rate == {"grpo_target": 2e-3, "trace": 2e-3}
    s = settings.parse_settings(["--learning-rate", "grpo_target=1e-3,trace=4e-3"], "doc")
    assert s.lr("grpo_target") == 1e-3 and s.lr("trace") == 4e-3
    assert s.record()["learning_rate"] == {"grpo_target": 1e-3, "trace": 4e-3}
    assert methods.grpo_cfg(s, "trace", "env", "m", 4, 0, 12)["learning_rate"] == 4e-3
    assert methods.grpo_cfg(s, "grpo_target", "env", "m", 4, 0, 12)["learning_rate"] == 1e-3
    for bad in (
        ["--learning-rate", "grpo_target=1e-3"],  # trace's rate missing
        ["--learning-rate", "grpo_target=1e-3,trace=1e-3,gepa=1"],
        ["--learning-rate", "fast"],
        ["--learning-rate", "1e-3", "--learning-rate-from", "x.json"],
        ["--lr-sweep", "--learning-rate-from", "x.json"],
    ):
        with pytest.raises(SystemExit) as e:
            settings.parse_settings(bad, "doc")
        assert e.value.code == 2, bad


def test_a_sweep_is_measured_on_the_validation_seeds():
    s = settings.parse_settings(["--lr-sweep", "--validation", "600000:600100", "--held-out", "7:9"], "doc")
    assert s.held_out == "600000:600100" and s.purpose == "lr_sweep" and s.record()["purpose"] == "lr_sweep"
    assert settings.parse_settings([], "doc").record()["purpose"] == "test"


def _sweep(
    path: Path, method: str, lr: float, values: list[float], args=("--budgets", "640"), **over
) -> Path:
    """A --lr-sweep result of one method and rate (the other settings from `args`): one run per value (training
    seeds 100, 101, ...)."""
    s = settings.parse_settings(["--lr-sweep", *args, "--learning-rate", str(lr)], "doc")
    col = method  # a row's column of a method is named after it
    runs = []
    for i, v in enumerate(values):
        run = {"target": "shop-mixed", "budget": max(s.budgets), "seed": 100 + i, "base": 0.4, col: v}
        run |= {"tasks_" + col: _outcomes([v] * 10)}
        run |= {"grpo_rollouts": 640} if method == "grpo_target" else {"spent": {"total": 600}}
        runs.append(run)
    doc = {
        "benchmark": "sample_efficiency",
        "commit": "abc",
        "dirty": False,
        "command": "python benchmarks/sample_efficiency.py --lr-sweep",
        "held_out": s.held_out,
        "methods": [method],
        "settings": s.record(),
        "train_seeds": [r["seed"] for r in runs],
        "targets": stats.summarize(runs),
        "runs": runs,
        **over,
    }
    return results.write(path, doc)


def test_the_sweep_chooses_each_methods_rate_and_records_its_cost(tmp_path):
    from se import sweep

    files = [
        _sweep(tmp_path / "g1.json", "grpo_target", 1e-3, [0.50, 0.52]),
        _sweep(tmp_path / "g2.json", "grpo_target", 2e-3, [0.55, 0.53]),
        _sweep(tmp_path / "t1.json", "trace", 1e-3, [0.60]),
        _sweep(tmp_path / "t2.json", "trace", 2e-3, [0.60]),  # a tie: the smaller rate
    ]
    s = settings.parse_settings(["--budgets", "320,640", "--learning-rate-from", *map(str, files)], "doc")
    chosen = sweep.apply(s)
    assert chosen.learning_rate == {"grpo_target": 2e-3, "trace": 1e-3}
    rec = chosen.lr_sweep
    assert rec["chosen"] == chosen.learning_rate and rec["measured_on"] == ["600000:600100"]
    assert rec["pass@1"]["grpo_target"] == {
        "0.001": {"mean": 0.51, "runs": 2},
        "0.002": {"mean": 0.54, "runs": 2},
    }
    # every training rollout of the sweep's runs and the validation episodes that chose
    assert rec["rollouts"] == {"grpo_target": 4 * (640 + 10), "trace": 2 * (600 + 10), "total": 3820}
    assert [f["file"] for f in rec["files"]] == list(map(str, files))


def test_the_sweep_refuses_test_seeds_dirty_runs_and_other_experiments(tmp_path):
    from se import sweep

    good = [
        _sweep(tmp_path / "g.json", "grpo_target", 1e-3, [0.5]),
        _sweep(tmp_path / "t.json", "trace", 1e-3, [0.6]),
    ]
    cases = {
        "overlap the test seeds": _sweep(tmp_path / "o.json", "trace", 2e-3, [0.9], held_out="500100:500300"),
        "dirty checkout": _sweep(tmp_path / "d.json", "trace", 2e-3, [0.9], dirty=True),
        "not a --lr-sweep result": _result(tmp_path / "r.json", 0, 0.4, 0.5),
        "another experiment (episodes_per_step)": _sweep(
            tmp_path / "e.json",
            "trace",
            2e-3,
            [0.9],
            settings={
                **settings.parse_settings(
                    ["--lr-sweep", "--budgets", "640", "--episodes-per-step", "16"], "doc"
                ).record()
            },
        ),
    }
    for why, bad in cases.items():
        s = settings.parse_settings(
            ["--budgets", "640", "--learning-rate-from", *map(str, [*good, bad])], "doc"
        )
        with pytest.raises(
            results.Refused, match=why.split(" (")[0] if "(" not in why else "another experiment"
        ):
            sweep.apply(s)
    only_one = settings.parse_settings(["--budgets", "640", "--learning-rate-from", str(good[0])], "doc")
    with pytest.raises(results.Refused, match="no sweep run of trace"):
        sweep.apply(only_one)
    assert sweep.apply(settings.parse_settings(["--budgets", "640"], "doc")).lr_sweep is None


def test_a_run_records_the_sweep_and_combine_keeps_it(tmp_path, run_benchmark):
    files = [
        _sweep(tmp_path / "g.json", "grpo_target", 1e-3, [0.5]),
        _sweep(tmp_path / "t.json", "trace", 4e-3, [0.6]),
    ]
    from se import sweep

    s = sweep.apply(
        settings.parse_settings(["--budgets", "640", "--learning-rate-from", *map(str, files)], "doc")
    )
    a = _result(
        tmp_path / "a.json", 0, 0.42, 0.46, settings={**s.record(), "budgets": [640]}, lr_sweep=s.lr_sweep
    )
    b = _result(
        tmp_path / "b.json", 1, 0.44, 0.50, settings={**s.record(), "budgets": [640]}, lr_sweep=s.lr_sweep
    )
    out = tmp_path / "all.json"
    proc = run_benchmark("sample_efficiency.py", "--combine", str(a), str(b), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = results.read(out)
    assert res["lr_sweep"]["chosen"] == {"grpo_target": 1e-3, "trace": 4e-3}
    assert res["settings"]["learning_rate"] == {"grpo_target": 1e-3, "trace": 4e-3}
    assert "learning rate sweep on seeds 600000:600100" in proc.stdout
    # a file chosen by another sweep is another experiment
    c = _result(tmp_path / "c.json", 2, 0.44, 0.50, settings={**s.record(), "budgets": [640]})
    proc = run_benchmark(
        "sample_efficiency.py", "--combine", str(a), str(c), "--out", str(tmp_path / "x.json")
    )
    assert proc.returncode == 2 and "lr_sweep differs" in proc.stderr


def _registration(tmp_path: Path, base: Path) -> Path:
    from se import freeze

    reg = {
        "issue": 31,
        "written": "test",
        "target": "shop-mixed",
        "base": str(base),
        "held_out": "700000:700600",
        "validation": "600000:600100",
        "train_seeds": [0, 1, 2, 3],
        "budget": 2560,
        "lr_grid": [1e-3, 2e-3],
        "lr_sweep_seed": 100,
        "trace_is": "moe",
        "decision": "mean gain ratio >= 2 and the paired bootstrap's 90 % lower bound of the difference > 0",
    }
    return freeze.register(tmp_path / "reg.json", reg)


def test_a_preregistered_run_must_be_the_registered_one(tmp_path):
    """The pre-registration fixes the target and base by digest, the seeds, the budget and the rate grid; a run
    that differs in any of them is refused, with every difference said."""
    from se import freeze, sweep

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"\0" * 64)
    reg = _registration(tmp_path, base)
    sweeps = []
    common = [
        "--target",
        "shop-mixed",
        "--base",
        str(base),
        "--budgets",
        "2560",
        "--validation",
        "600000:600100",
    ]
    # the sweep processes: validation seeds, the sweep seed, a rate of the grid
    ok_sweep = settings.parse_settings(
        [*common, "--lr-sweep", "--train-seeds", "100", "--learning-rate", "1e-3"], "doc"
    )
    assert freeze.check(reg, ok_sweep)["digests_now"] == results.read(reg, freeze.PREREGISTRATION)["digests"]
    bad_sweep = settings.parse_settings(
        [*common, "--lr-sweep", "--train-seeds", "0", "--learning-rate", "3e-3"], "doc"
    )
    with pytest.raises(results.Refused) as e:
        freeze.check(reg, bad_sweep)
    assert "train seeds [0] (registered: [100])" in str(e.value) and "learning rates [0.003]" in str(e.value)
    # the test run: registered test seeds, its rates from a sweep over the grid
    for m in ("grpo_target", "trace"):
        for lr in (1e-3, 2e-3):
            sweeps.append(_sweep(tmp_path / f"{m}-{lr}.json", m, lr, [0.5 + lr], args=common))
    run = [*common, "--held-out", "700000:700600", "--train-seeds", "2"]
    s = sweep.apply(settings.parse_settings([*run, "--learning-rate-from", *map(str, sweeps)], "doc"))
    assert freeze.check(reg, s)["file"] == str(reg)
    no_sweep = settings.parse_settings(run, "doc")
    with pytest.raises(results.Refused, match="no --learning-rate-from"):
        freeze.check(reg, no_sweep)
    other = sweep.apply(
        settings.parse_settings(
            [
                *common,
                "--held-out",
                "500000:500600",
                "--train-seeds",
                "4",
                "--learning-rate-from",
                *map(str, sweeps),
            ],
            "doc",
        )
    )
    with pytest.raises(results.Refused) as e:
        freeze.check(reg, other)
    assert "test seeds 500000:500600 (registered: 700000:700600)" in str(e.value)
    assert "train seeds [4]" in str(e.value)
    # the base agent changed after it was registered: its digest says so
    (base / "model.safetensors").write_bytes(b"\1" * 64)
    with pytest.raises(results.Refused, match="base digest"):
        freeze.check(reg, s)


def test_the_target_digest_follows_what_the_target_does():
    from se import freeze

    assert freeze.tasks_sha256("shop-mixed") == freeze.tasks_sha256("shop-mixed")
    assert freeze.tasks_sha256("shop-mixed") != freeze.tasks_sha256("shop")
    assert freeze.tasks_sha256("shop-ladder") not in (
        freeze.tasks_sha256("shop"),
        freeze.tasks_sha256("shop-mixed"),
    )


def test_a_target_on_more_packages_digests_them_all_and_shop_mixed_keeps_its_digest(tmp_path, monkeypatch):
    from se import freeze

    mixed = freeze.source_sha256("shop-mixed")
    assert mixed == freeze.dir_sha256(freeze.TARGET_PACKAGE) == freeze.source_sha256("shop")
    ladder = freeze.source_sha256("shop-ladder")
    assert ladder != mixed
    # a change to the ladder's package changes its digest and not shop-mixed's
    copy = tmp_path / "ladder"
    copy.mkdir()
    for f in freeze.TARGET_PACKAGES["shop-ladder"][0].glob("*.py"):
        (copy / f.name).write_bytes(f.read_bytes())
    monkeypatch.setitem(freeze.TARGET_PACKAGES, "shop-ladder", (copy,))
    assert freeze.source_sha256("shop-ladder") == ladder
    (copy / "tasks.py").write_text((copy / "tasks.py").read_text() + "\n# changed\n")
    assert freeze.source_sha256("shop-ladder") != ladder and freeze.source_sha256("shop-mixed") == mixed


def test_the_benchmark_refuses_a_run_that_is_not_the_registered_one(tmp_path, run_benchmark):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    reg = _registration(tmp_path, base)
    out = tmp_path / "se.json"
    args = ["--preregistered", str(reg), "--target", "shop-mixed", "--base", str(base), "--budgets", "2560"]
    proc = run_benchmark("sample_efficiency.py", *args, "--store", str(tmp_path / "st"), "--out", str(out))
    assert proc.returncode == 2 and "not the registered run" in proc.stderr, proc.stderr[-2000:]
    assert "test seeds 500000:500200 (registered: 700000:700600)" in proc.stderr
    assert not out.exists() and not (tmp_path / "st").exists()


def test_confirm_script_runs_the_registered_processes(tmp_path):
    """confirm.sh (DRY=1): the sweep is one process per method and rate of the registered grid, on the sweep seed;
    the main run one per method and training seed, with the sweep's results (never a partial file); each passes
    --preregistered; a process whose result exists is not run again."""
    import subprocess

    script = Path(results.REPO) / "benchmarks" / "preregistered" / "confirm.sh"
    env = {"PATH": "/usr/bin:/bin", "DRY": "1", "OUT": str(tmp_path), "STORES": str(tmp_path / "st")}
    env["PY"] = __import__("sys").executable

    def run(phase):
        done = subprocess.run(
            ["bash", str(script), phase], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if "sample_efficiency.py" in line]

    sweep = run("sweep")
    assert len(sweep) == 6 and all(
        "--preregistered" in c and "--lr-sweep --train-seeds 100" in c for c in sweep
    )
    assert (
        sorted(c.split("--learning-rate ")[1] for c in sweep) == ["0.001"] * 2 + ["0.002"] * 2 + ["0.004"] * 2
    )
    for name in ("lr-trace-0.001.json", "lr-trace-0.001.partial.json", "se-trace-0.json"):
        (tmp_path / name).write_text("{}")
    main = run("main")
    assert len(main) == 7  # se-trace-0 is done
    assert all("--held-out 700000:700600" in c and c.endswith("lr-trace-0.001.json") for c in main)


def test_a_grpo_sweep_stands_for_runs_whose_trace_settings_differ(tmp_path):
    """TRACE's early stopping does not touch GRPO on the target: its sweep still counts; TRACE's sweep does not."""
    from se import sweep

    early = ("--budgets", "640", "--adapter-validation", "200000:200032", "--validation-every", "8")
    g = _sweep(tmp_path / "g.json", "grpo_target", 1e-3, [0.5])  # swept with the default early stopping
    t_old = _sweep(tmp_path / "t0.json", "trace", 1e-3, [0.6])
    t_new = _sweep(tmp_path / "t1.json", "trace", 1e-3, [0.6], args=early)
    run = settings.parse_settings([*early, "--learning-rate-from", str(g), str(t_new)], "doc")
    assert sweep.apply(run).learning_rate == {"grpo_target": 1e-3, "trace": 1e-3}
    stale = settings.parse_settings([*early, "--learning-rate-from", str(g), str(t_old)], "doc")
    with pytest.raises(results.Refused, match="another experiment .*adapter_validation"):
        sweep.apply(stale)
    other_grpo = _sweep(
        tmp_path / "g2.json", "grpo_target", 2e-3, [0.5], args=(*early, "--episodes-per-step", "16")
    )
    with pytest.raises(results.Refused, match="episodes_per_step"):
        sweep.apply(
            settings.parse_settings([*early, "--learning-rate-from", str(other_grpo), str(t_new)], "doc")
        )


def test_a_registration_can_fix_any_setting(tmp_path):
    from se import freeze

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    reg_path = _registration(tmp_path, base)
    reg = results.read(reg_path, freeze.PREREGISTRATION)
    reg["settings"] = {"validation_every": 8, "adapter_validation": "200000:200032"}
    reg_path.write_text(json.dumps(reg))
    common = ["--target", "shop-mixed", "--base", str(base), "--budgets", "2560", "--lr-sweep"]
    common += ["--train-seeds", "100", "--learning-rate", "1e-3"]
    ok = settings.parse_settings(
        [*common, "--adapter-validation", "200000:200032", "--validation-every", "8"], "doc"
    )
    assert freeze.check(reg_path, ok)["settings"] == reg["settings"]
    with pytest.raises(results.Refused) as e:
        freeze.check(reg_path, settings.parse_settings(common, "doc"))
    assert "validation_every 4 (registered: 8)" in str(e.value)
    assert "adapter_validation 200000:200016 (registered: 200000:200032)" in str(e.value)


def _registered_pair(tmp_path: Path, seed: int, gain: float, reg: dict, n: int = 30) -> Path:
    """One seed's result of a registered run (both methods in one file), with per-task outcomes."""
    tasks = {
        "tasks_base": _outcomes([0.0] * n),
        "tasks_grpo_target": _outcomes([0.2] * n),
        "tasks_trace": _outcomes([gain] * n),
    }
    run = _run(reg["budget"], seed, 0.0, 0.2, gain, 0.1, **tasks)
    return _result(tmp_path / f"{seed}.json", seed, 0.2, gain, runs=[run], preregistration=reg)


@pytest.mark.parametrize(
    ("gains", "seeds", "state"),
    [
        ((0.6, 0.4), (0, 1), "HOLDS"),  # ratio 2.5, lower bound +0.200
        # ratio 1.5: the difference's lower bound is > 0, the ratio short
        ((0.3, 0.3), (0, 1), "does not hold"),
        ((0.6,), (0,), "incomplete"),  # seed 1 missing: never holds, whatever the numbers
    ],
)
def test_combine_applies_the_registered_decision(tmp_path, run_benchmark, gains, seeds, state):
    """A registered run's combined result says whether the registered rule holds, from the two numbers it
    names (gain ratio >= 2, 90 % lower bound of TRACE gain - GRPO gain > 0), and only with every seed in."""
    reg = {
        "file": "reg.json",
        "target": "shop-mixed",
        "train_seeds": [0, 1],
        "budget": 640,
        "held_out": "500000:500200",
        "digests": {},
        "digests_now": {},
    }
    paths = [_registered_pair(tmp_path, s, g, reg) for s, g in zip(seeds, gains, strict=True)]
    out = tmp_path / "all.json"
    proc = run_benchmark("sample_efficiency.py", "--combine", *map(str, paths), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    v = results.read(out)["verdict"]
    assert v["holds"] is (state == "HOLDS") and v["complete"] is (state != "incomplete")
    assert v["runs"] == {"grpo_target": len(seeds), "trace": len(seeds)}
    if state == "does not hold":
        assert v["gain_ratio"] == 1.5 and not v["ratio_met"] and v["lower_bound_met"]
    assert "pre-registered decision (gain ratio >= 2 and 90 % lower bound" in proc.stdout
    assert f": {state} — gain ratio {v['gain_ratio']:.2f}×" in proc.stdout


def test_targets_train_and_test_where_they_should():
    """shop targets keep their seed ranges (the committed runs' configs are unchanged); τ²-bench targets train on
    τ²'s train split, test on every task of its test split and choose on training tasks, with --tau2-user."""
    from se.targets import target

    shop = target("shop-mixed")
    assert (shop.train_env, shop.test_env, shop.max_turns) == ("shop-mixed", "shop-mixed", 16)
    assert shop.train_seeds == "300000:400000" and shop.diagnosis_seeds(100) == "300000:300100"
    assert shop.held_out is None and shop.validation is None and shop.moe_seeds(16) == "350000:350016"
    s = settings.parse_settings(["--target", "tau2-retail", "--held-out", "5:9"], "doc")
    t = s.target("tau2-retail")
    assert t.train_env == "tau2-retail?split=train&user=scripted" and t.test_env.startswith(
        "tau2-retail?split=test"
    )
    assert s.held_out_of("tau2-retail") == "0:40" and s.held_out_of("shop") == "5:9"
    assert t.train_seeds == t.validation == "0:74" and t.synthesize == "tau2-retail"
    llm = "user=llm&user_model=openai:http://h:1/v1?model=b"
    assert (
        settings.parse_settings(["--target", "tau2-airline", "--tau2-user", llm], "doc")
        .target("tau2-airline")
        .test_env
        == f"tau2-airline?split=test&{llm}"
    )
