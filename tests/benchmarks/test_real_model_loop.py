"""benchmarks/real_model_loop.py: its arithmetic (GRPO steps for >= N rollouts, calibration steps reused), the
acceptance from the four evaluations, and --dry-run (every stage config accepted by the stage schemas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith("estimate")
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
