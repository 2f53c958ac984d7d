"""Issue 4 acceptance on the demo world: diagnose (rules analyst) recovers exactly the deficits a base agent
was built with, and rejects the distractors. The base agent here is the scripted deficit policy
(`policy:demonstration`, the behaviour the SFT base agent is trained to imitate), evaluated on 200 seeds."""

from __future__ import annotations

import json

import pytest
from trace_testing import run_cli

CAPS = [
    "multi_step_completion",
    "precondition_verification",
    "structured_data_reasoning",
    "tool_calling_precision",
]


def _eval_and_diagnose(store, deficits: list[str]) -> dict:
    model = f"policy:demonstration?deficits={','.join(deficits)}&rate=1"
    r = run_cli(
        "eval",
        "--model",
        model,
        "--env",
        "shop",
        "--seeds",
        "0:200",
        "--store",
        store,
        "--name",
        "base",
        "--json",
    )
    assert r.exit_code == 0, r.output
    r = run_cli("diagnose", "--rollouts", "store://rollouts/base", "--store", store, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    "deficits",
    [
        ["precondition_verification", "multi_step_completion"],  # the demo's base agent
        ["structured_data_reasoning", "tool_calling_precision"],
        ["multi_step_completion", "structured_data_reasoning"],
        ["tool_calling_precision"],
    ],
)
def test_selected_capabilities_equal_the_deficits(tmp_path, deficits):
    doc = _eval_and_diagnose(str(tmp_path / "store"), deficits)
    selected = {c["name"] for c in doc["selected"]}
    assert selected == set(deficits)  # precision and recall 1.0
    rejected = {c["name"]: c for c in doc["rejected"]}
    for distractor in ("tone_and_empathy", "language_fluency", "proactive_upselling"):
        assert distractor in rejected and rejected[distractor]["distractor"] is True
    for c in doc["selected"]:
        assert c["runs_passed"] >= 8 and c["mean_delta"] >= 0.2 and c["mean_coverage"] >= 0.1


def test_demonstration_policy_fails_where_it_was_handicapped(tmp_path):
    r = run_cli(
        "eval",
        "--model",
        "policy:demonstration?deficits=precondition_verification,multi_step_completion&rate=1",
        "--env",
        "shop",
        "--seeds",
        "0:120",
        "--store",
        str(tmp_path),
        "--json",
    )
    fam = {f: v["pass@1"] for f, v in json.loads(r.stdout)["summary"]["families"].items()}
    assert fam["multi_op"] == 0.0 and fam["cancel_order"] <= 0.25
    assert all(fam[f] == 1.0 for f in ("order_status", "return_item", "address_update", "exchange"))


def test_demonstration_rate_mixes_reference_and_deficit(tmp_path):
    r = run_cli(
        "eval",
        "--model",
        "policy:demonstration?deficits=multi_step_completion&rate=0.5",
        "--env",
        "shop?families=multi_op",
        "--seeds",
        "0:60",
        "--store",
        str(tmp_path),
        "--json",
    )
    p = json.loads(r.stdout)["summary"]["pass@1"]
    assert 0.25 <= p <= 0.75


@pytest.mark.parametrize(
    "ref",
    [
        "policy:demonstration?rate=2",
        "policy:demonstration?nope=1",
        "policy:demonstration?rate=x",
        "policy:demonstration?deficits=not_a_capability",
    ],
)
def test_bad_demonstration_policy_refs_exit_2(tmp_path, ref):
    r = run_cli("eval", "--model", ref, "--env", "shop", "--seeds", "0:4", "--store", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "rollouts").exists()
