"""`trace synthesize --target tau2-retail`: from τ²-bench's own retail results (ingest, rules diagnosis) to
environments on the τ²-retail world: every selected capability synthesized, all 15 of τ²'s tool schemas offered
byte for byte, the world and τ²'s fingerprint recorded, the reference solving every seed of the artifact."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml
from trace_testing import TAU2_FILES, run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tau2") is None, reason="τ²-bench is not installed")


def test_tau2_results_to_environments_on_the_tau2_retail_world(tau2_dir, tmp_path):
    from trace_cli.envs.tau2.package import domain
    from trace_cli.store import Store

    root = str(tmp_path / "store")
    r = run_cli("ingest", "tau2", str(tau2_dir / TAU2_FILES["retail"]), "--name", "retail", "--store", root)
    assert r.exit_code == 0, r.output
    r = run_cli("diagnose", "--rollouts", "retail", "--analyst", "rules", "--name", "diag", "--store", root)
    assert r.exit_code == 0, r.output
    st = Store(root)
    selected = [c["name"] for c in yaml.safe_load(
        (st.resolve("diag", kind="diagnosis").path / "capabilities.yaml").read_text()
    )["selected"]]  # fmt: skip
    assert selected
    r = run_cli(
        "synthesize", "--diagnosis", "diag", "--target", "tau2-retail", "--model", "policy:demonstration?rate=0.5",
        "--calibration-seeds", "16", "--json", "--store", root,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    dom = domain("retail")
    want = {t["function"]["name"]: json.dumps(t) for t in dom.tools}
    for cap in selected:
        art = st.resolve(cap, kind="environment")
        doc = yaml.safe_load((art.path / "environment.yaml").read_text())
        assert doc["world"] == {"name": "tau2-retail", "generator": 1, "tau2": dom.fingerprint}
        assert doc["policy"] == "tau2-retail"
        assert {t["function"]["name"]: json.dumps(t) for t in doc["tools"]} == want
        assert set(doc["tool_sources"].values()) == {"target"}
        r = run_cli(
            "eval",
            "--env",
            art.uri,
            "--model",
            "policy:reference",
            "--seeds",
            "0:60",
            "--json",
            "--store",
            root,
        )
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["summary"]["pass@1"] == 1.0, cap
