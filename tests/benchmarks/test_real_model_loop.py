"""benchmarks/real_model_loop.py: its arithmetic (GRPO steps for >= N rollouts, calibration steps reused), the
acceptance from the four evaluations, and --dry-run (every stage config accepted by the stage schemas)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import real_model_loop as rml  # noqa: E402


def test_grpo_steps_cover_the_rollouts():
    assert rml.grpo_steps(256, 16) == 16
    assert rml.grpo_steps(257, 16) == 17
    assert rml.grpo_steps(5, 16) == 1
    assert all(rml.grpo_steps(n, k) * k >= n for n in (1, 100, 256, 999) for k in (4, 8, 16, 24))


def test_reuse_takes_whole_steps_and_never_more_than_the_run():
    assert rml.reuse_steps(128, 16, 16) == 8
    assert rml.reuse_steps(120, 16, 16) == 7
    assert rml.reuse_steps(1000, 16, 16) == 16
    assert rml.reuse_steps(0, 16, 16) == 0


def test_plan_trains_on_at_least_the_asked_rollouts_and_evaluates_held_out_seeds():
    a = rml.parse_args(["--rollouts", "300", "--episodes-per-step", "24", "--num-generations", "8"])
    c = rml.configs(a, "B", "S", "R", "D", "cap", "E")
    g = c["grpo"]
    assert g["max_steps"] * g["per_device_batch_size"] * g["gradient_accumulation_steps"] >= 300
    assert g["model"] == "S" and g["env"] == "E" and c["synthesize"]["model"] == "S"
    lo, hi = (int(x) for x in g["seeds"].split(":"))
    for label in ("env_eval_base", "env_eval_adapter"):
        elo, ehi = (int(x) for x in c[label]["seeds"].split(":"))
        assert ehi - elo == 200 and (ehi <= lo or elo >= hi)  # held out from GRPO's seeds
    slo, shi = (int(x) for x in c["sft"]["seeds"].split(":"))
    for label in ("shop_eval_base", "shop_eval_adapter", "diag_rollouts"):
        elo, ehi = (int(x) for x in c[label]["seeds"].split(":"))
        assert ehi <= slo or elo >= shi  # disjoint from the demonstrations
    cal = c["synthesize"]["calibration"]
    assert (
        cal["max_new_tokens"] == g["max_new_tokens"]
        and cal["max_completion_length"] == g["max_completion_length"]
    )
    assert c["synthesize"]["max_turns"] == g["max_turns"]


def test_summarize_checks_the_delta():
    res = {
        "env_eval_base": {"pass@1": 0.2},
        "env_eval_adapter": {"pass@1": 0.31},
        "shop_eval_base": {"pass@1": 0.38},
        "shop_eval_adapter": {"pass@1": 0.36},
    }
    acc = rml.summarize(res)
    assert acc["env_delta"] == 0.11 and acc["meets_goal"]
    assert acc["shop_delta"] == -0.02
    res["env_eval_adapter"]["pass@1"] = 0.29
    assert not rml.summarize(res)["meets_goal"]


def test_dry_run_validates_every_stage_config():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "real_model_loop.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    labels = [
        line.split()[0]
        for line in proc.stdout.splitlines()
        if line and not line.startswith(("estimate", "GRPO"))
    ]
    assert labels == list(rml.STAGE_OF)
    assert "total" in proc.stdout
    bad = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "real_model_loop.py"), "--dry-run", "--max-turns", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0  # a config the schemas refuse fails the dry run


# ------------------------------------------------------------------------------------- --profile session (issue 33)
def test_session_profile_sets_its_sizes_and_flags_still_win():
    a = rml.parse_args(["--profile", "session"])
    assert (a.demos, a.env_eval_seeds, a.diag_rollouts, a.budget_min) == (48, 100, 0, 150.0)
    b = rml.parse_args(["--profile", "session", "--demos", "10", "--env-eval-seeds", "120"])
    assert (b.demos, b.env_eval_seeds, b.cal_seeds) == (10, 120, 8)
    assert rml.parse_args([]).budget_min is None and rml.parse_args([]).demos == 160


def test_session_plan_diagnoses_the_base_evaluation_and_holds_out_100_env_seeds():
    a = rml.parse_args(["--profile", "session"])
    c = rml.configs(a, "B", "S", "R", "D", "cap", "E", steps=7)
    assert "diag_rollouts" not in c and c["diagnose"]["rollouts"] == "R"
    assert c["grpo"]["max_steps"] == 7 and c["synthesize"]["model"] == "S"
    lo, hi = (int(x) for x in c["grpo"]["seeds"].split(":"))
    for label in ("env_eval_base", "env_eval_adapter"):
        elo, ehi = (int(x) for x in c[label]["seeds"].split(":"))
        assert ehi - elo >= 100 and (ehi <= lo or elo >= hi)


def test_budget_steps_fit_what_the_evaluations_leave():
    a = rml.parse_args(["--profile", "session"])  # 150 min; 8 episodes a step; 32 calibration episodes
    most = rml.grpo_steps(a.rollouts, a.episodes_per_step)
    reused = rml.reuse_steps(a.cal_seeds * a.cal_rollouts, a.episodes_per_step, most)
    assert (
        rml.evals_after_grpo(a) == 100
    )  # the base's env eval runs beside GRPO, the shop eval beside the env one
    assert rml.evals_after_grpo(rml.parse_args(["--profile", "session", "--no-parallel-evals"])) == 230
    evals = rml.evals_after_grpo(a) * 10.0
    per_step = a.episodes_per_step * 5.0 * rml.GRPO_TRAIN_FACTOR
    left = 9000 - 7000 - evals
    assert rml.budget_steps(a, 7000, 10.0, 5.0) == reused + int(left // per_step) < most
    assert rml.budget_steps(a, 9000, 10.0, 5.0) == reused + 1  # over budget: the reused steps and one more
    assert rml.budget_steps(a, 0, 0.0, 0.001) == most  # never more than --rollouts asks for
    assert rml.budget_steps(rml.parse_args([]), 10**6, 10.0, 5.0) == rml.grpo_steps(256, 16)  # no budget
    fixed = rml.parse_args(["--profile", "session", "--grpo-steps", "7"])
    assert rml.budget_steps(fixed, 9000, 10.0, 5.0) == rml.budget_steps(fixed, 0, 0.0, 0.001) == 7


def test_synthesize_first_records_a_failed_calibration_and_tries_the_next_capability():
    from types import SimpleNamespace

    from trace_cli.errors import CheckFailed

    tried: list[str] = []

    def step(label, cfg):
        tried.append(cfg["capability"])
        if cfg["capability"] != "second":
            raise CheckFailed(f"calibration of {cfg['capability']} failed after 4 attempt(s)")
        res["synthesize_s"] = 12.5
        env = SimpleNamespace(uri="store://environment/e", summary={})
        return SimpleNamespace(outputs={"environment": env})

    def plan_for(cap):
        return {"synthesize": {"capability": cap}}

    res: dict = {}
    a = rml.parse_args(["--profile", "session"])
    cap, env = rml.synthesize_first(a, ["first", "second", "third"], plan_for, step, res)
    assert (cap, env.uri, tried) == ("second", "store://environment/e", ["first", "second"])
    assert (
        res["calibrations"]["first"]["calibrated"] is False
        and "4 attempt" in res["calibrations"]["first"]["error"]
    )
    assert res["calibrations"]["second"] == {
        "calibrated": True,
        "wall_s": 12.5,
        "uri": "store://environment/e",
    }
    # none calibrates: every failure recorded, no environment
    tried.clear()
    cap, env = rml.synthesize_first(a, ["first", "third"], plan_for, step, res)
    assert env is None and tried == ["first", "third"] and list(res["calibrations"]) == ["first", "third"]
    # --capability picks one (and only one the diagnosis selected)
    tried.clear()
    picked = rml.parse_args(["--profile", "session"])
    picked.capability = (
        "second"  # parse_args checks a name against the catalogue; this test's names are its own
    )
    assert rml.synthesize_first(picked, ["first", "second"], plan_for, step, res)[0] == "second"
    assert tried == ["second"]
    with pytest.raises(SystemExit, match="selected first"):
        rml.synthesize_first(picked, ["first"], plan_for, step, res)


def test_an_unknown_capability_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        rml.parse_args(["--profile", "session", "--capability", "tool_calling_precison"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--capability tool_calling_precison: not in the catalogue" in err and "tool_calling_precision" in err
    )
    assert rml.parse_args(["--capability", "tool_calling_precision"]).capability == "tool_calling_precision"


def test_session_dry_run_validates_its_configs(run_benchmark):
    proc = run_benchmark("real_model_loop.py", "--dry-run", "--profile", "session", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    labels = [
        line.split()[0] for line in proc.stdout.splitlines() if line and line.split()[0] in rml.STAGE_OF
    ]
    assert labels == [k for k in rml.STAGE_OF if k != "diag_rollouts"]
    assert "as many as fit in 150.0 min" in proc.stdout
    assert "4 of them from the calibration" in proc.stdout  # 8 seeds x 4 rollouts = 4 steps of 8 episodes


@pytest.mark.slow
def test_session_profile_runs_end_to_end_on_a_small_checkpoint(run_benchmark, tmp_path):
    """The whole --profile session flow (diagnosis on the base eval, budgeted GRPO, the JSON's fields) on the
    committed demo base agent with tiny sizes and --plumbing (checks the flow, not the result)."""
    out = tmp_path / "r.json"
    sizes = "--demos 3 --shop-eval-seeds 16 --env-eval-seeds 3 --cal-seeds 2 --cal-rollouts 2 --eval-batch 16"
    args = f"--profile session {sizes} --budget-min 0.1 --max-new-tokens 48 --plumbing --threads 1".split()
    src = [
        "--source",
        str(REPO / "examples" / "demo-base-agent"),
        "--store",
        str(tmp_path / "s"),
        "--out",
        str(out),
    ]
    # first up to the calibrated environment and the base's evaluation on it (a session's worth), then on
    first = tmp_path / "first.json"
    src_first = [str(first) if s == str(out) else s for s in src]
    proc = run_benchmark("real_model_loop.py", *args, *src_first, "--stop-before-grpo", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    part = json.loads(first.read_text())
    assert "env_eval_base" in part and "grpo" not in part and part["reused"] == []
    proc = run_benchmark("real_model_loop.py", *args, *src, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["reused"]) == set(part["stages_s"]) and all(
        doc["stages_s"][k] == v for k, v in part["stages_s"].items()
    )
    assert doc["profile"] == "session" and doc["device"] == "cpu" and doc["commit"]
    assert (
        "diag_rollouts_s" not in doc
        and doc["configs"]["diagnose"]["rollouts"] == doc["shop_eval_base"]["rollouts"]
    )
    assert (
        doc["configs"]["grpo"]["max_steps"] == doc["configs"]["grpo"]["reuse_calibration"] + 1
    )  # over budget
    assert doc["grpo_seconds_per_episode"] > 0
    assert set(doc["stages_s"]) == {k for k in rml.STAGE_OF if k != "diag_rollouts"}
    assert doc["env_eval_base"]["episodes"] == 3 and "shop_pass@1_adapter" in doc["acceptance"]
    # a rerun on the same store finds every stage up to date and reports what each cost when it ran
    again = tmp_path / "again.json"
    proc = run_benchmark(
        "real_model_loop.py", *args, *[str(again) if s == str(out) else s for s in src], timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    redo = json.loads(again.read_text())
    assert set(redo["reused"]) == set(doc["stages_s"]) and redo["stages_s"] == doc["stages_s"]
    assert redo["acceptance"] == doc["acceptance"]
