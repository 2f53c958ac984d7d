"""`recipes/tau2-retail.yaml` end to end on a fresh store (the CPU smoke sizes it is written with): real τ²-bench
results ingested and diagnosed, an environment per selected capability on τ²-retail's own world, an adapter each,
GRPO on the target, the router, and evaluations on τ²'s test split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_tau2_retail_recipe_runs_end_to_end(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"}
    trace = [sys.executable, "-m", "trace_cli"]
    store = ["--store", str(tmp_path / "store")]
    run = subprocess.run(
        [*trace, "run", str(REPO / "recipes" / "tau2-retail.yaml"), *store, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads(run.stdout)["steps"]}
    assert all(s["status"] == "ran" for s in steps.values()), steps
    synthesized = [k for k in steps if k.startswith("synthesize[")]
    assert synthesized and len([k for k in steps if k.startswith("train[")]) == len(synthesized)
    # every environment offers τ²-retail's 15 tools, schemas as τ² writes them
    from trace_cli.envs.tau2.package import domain
    from trace_cli.store import Store

    s = Store(tmp_path / "store")
    for k in synthesized:
        (uri,) = steps[k]["outputs"].values()
        art = s.resolve(uri, kind="environment")
        from trace_cli.envs.loading import load_environment

        obs = load_environment(art).reset(0)
        mine = {t["function"]["name"]: json.dumps(t) for t in obs.tools}
        assert mine == {t["function"]["name"]: json.dumps(t) for t in domain("retail").tools}
    # the evaluations ran on τ²'s test split with the (labelled) scripted user
    ev = s.resolve("tau2-router-test", kind="eval")
    assert ev.summary["episodes"] == 4
    rerun = subprocess.run(
        [*trace, "run", str(REPO / "recipes" / "tau2-retail.yaml"), *store, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0 and all(s["status"] == "skipped" for s in json.loads(rerun.stdout)["steps"])
