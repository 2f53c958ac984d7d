"""benchmarks/mechanism_gates.py (issue 44): it refuses any seed range that reaches the test seeds; (slow) its
plumbing at a tiny size — the tiny model (no success to diagnose: every gate fails, each saying why) and the
committed shop-mixed base (a planted capability selected, calibrated, trained in isolation and measured on its
single-skill family; GRPO on the target against the perfect-expert ceiling). Sizes are plumbing, not results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))

TINY_SIZES = [
    "--target",
    "shop-ladder",
    "--validation",
    "600000:600018",
    "--bootstrap-seeds",
    "2",
    "--calibration-look",
    "0",
    "--calibration-attempts",
    "1",
    "--calibration-set",
    "band=[0,1]",
    "--calibration-set",
    "max_group_all0=1",
    "--calibration-set",
    "max_group_all1=1",
    "--calibration-set",
    "min_seeds=1",
    "--episodes-per-step",
    "8",
    "--num-generations",
    "4",
]
N = 2  # planted skills on shop-ladder (trace_cli.envs.ladder.PLANTED)
GATES = 1 + N + N + 1  # diagnosis, a calibration and an isolated adapter per planted skill, the ceiling


def test_the_gates_never_touch_a_test_seed(tmp_path, run_benchmark):
    for args in (["--validation", "699990:700010"], ["--diagnosis-rollouts", "400001"]):
        out = tmp_path / "g.json"
        proc = run_benchmark("mechanism_gates.py", "--base", "x", "--out", str(out), *args, timeout=120)
        assert proc.returncode == 2 and "below seed 700000" in proc.stderr, proc.stderr[-1000:]
        assert not out.exists()


def test_every_planted_skill_of_a_target_has_a_family_to_lift(monkeypatch):
    """A gate that can only fail is a defect: each skill planted on a target has a single-skill family there (the
    isolated-adapter gate measures it) and a calibration template; shop-mixed's planted set is its own (no lookup)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import mechanism_gates as mg

    from trace_cli.envs.ladder import PLANTED
    from trace_cli.envs.synthetic import TEMPLATES

    assert mg.PLANTED_ON["shop-ladder"] == list(PLANTED) and len(PLANTED) == N
    assert set(mg.PLANTED_ON["shop-mixed"]) < set(PLANTED)
    for target, planted in mg.PLANTED_ON.items():
        assert all(cap in mg.SINGLE_FAMILY[target] for cap in planted), target
        assert all(cap in TEMPLATES for cap in planted), target


def _gates(path: Path, control: bool = False) -> dict:
    res = json.loads(path.read_text())
    assert res["benchmark"] == "mechanism_gates" and res["commit"] and res["issue"] == 44
    if control:  # the capacity control's gates (one per planted skill) come first
        assert [g["gate"].split()[:3] for g in res["gates"][:N]] == [["capacity", "control", "learns"]] * N
        res["gates"] = res["gates"][N:]
    assert len(res["gates"]) == GATES
    for g in res["gates"]:
        assert {"gate", "threshold", "measured", "pass"} <= set(g)
    assert res["passed"] == all(g["pass"] for g in res["gates"])
    assert all(
        int(x) < res["seeds"]["test_floor"]
        for k in ("validation", "diagnosis")
        for x in res["seeds"][k].split(":")
    )
    return res


@pytest.mark.slow
def test_tiny_model_every_gate_fails_saying_why(tmp_path, tmp_path_factory, run_benchmark):
    import tinymodel

    tiny = tinymodel.tiny(tmp_path_factory)
    out = tmp_path / "gates.json"
    proc = run_benchmark(
        "mechanism_gates.py",
        "--base",
        str(tiny.hf),
        "--control",
        str(tiny.hf),
        *TINY_SIZES,
        "--diagnosis-rollouts",
        "12",
        "--calibration",
        "2x2",
        "--isolated-budget",
        "8",
        "--grpo-budget",
        "8",
        "--max-new-tokens",
        "16",
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(out),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    control = json.loads(out.read_text())["gates"][:N]
    assert [g["measured"] for g in control] == [0.0] * N and not any(g["pass"] for g in control)
    res = _gates(out, control=True)
    assert res["control"]["digest"] and len(res["control"]["families"]) == 3
    diag, *rest = res["gates"]
    assert not res["passed"] and diag["measured"] is None and "no successes" in diag["why"]
    assert [g["why"] for g in rest[:N]] == ["no diagnosis"] * N
    assert [g["why"] for g in rest[N : 2 * N]] == ["no environment"] * N
    assert rest[2 * N]["grpo_rollouts"] == 8 and rest[2 * N]["ceiling"]["episodes"] == 18
    assert "all gates pass: False" in proc.stdout


@pytest.mark.slow
def test_a_real_base_goes_through_every_gate(tmp_path, run_benchmark):
    """The committed shop-mixed base (~2.6M parameters) on shop-ladder: the diagnosis selects at least one planted
    capability; each selected one is calibrated (band [0,1]: plumbing), trained in isolation with its budget and
    measured on its single-skill family; GRPO on the target gives the gain the ceiling is compared with."""
    out = tmp_path / "gates.json"
    proc = run_benchmark(
        "mechanism_gates.py",
        "--base",
        "examples/shop-mixed-base-agent",
        *TINY_SIZES,
        "--diagnosis-rollouts",
        "30",
        "--calibration",
        "4x4",
        "--isolated-budget",
        "16",
        "--grpo-budget",
        "16",
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(out),
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = _gates(out)
    diag = res["gates"][0]
    assert set(diag["selection_frequency"]) == set(res["planted"]) and diag["measured"] is not None
    calibrated = [g for g in res["gates"][1 : 1 + N] if g["pass"]]
    assert calibrated and all(g["environment"].startswith("store://environment/") for g in calibrated)
    isolated = [g for g in res["gates"][1 + N : 1 + 2 * N] if g.get("adapter_uri")]
    assert len(isolated) == len(calibrated) and all(g["rollouts"] == 16 for g in isolated)
    for g in isolated:
        assert g["measured"] == pytest.approx(g["adapter"] - g["base"], abs=1e-4)
    ceiling = res["gates"][1 + 2 * N]
    # the experts: every calibrated environment, planted or not (what TRACE would train)
    others = {c for c, e in res["other_selected_environments"].items() if e.get("environment")}
    assert set(res["other_selected_environments"]) == set(diag["selected"]) - set(res["planted"])
    assert ceiling["grpo_rollouts"] == 16 and ceiling["experts"] == sorted(
        {g["gate"].split()[0] for g in calibrated} | others
    )
    assert 0.0 <= ceiling["ceiling_gain"] <= 1.0 and ceiling["ceiling"]["episodes"] == 18
    assert res["base_digest"] and len(res["base_digest"]) == 64
