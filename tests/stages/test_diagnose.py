"""`trace diagnose`: bad inputs (exit 2, nothing written) and the `rules` analyst on the shared τ² retail results."""

from __future__ import annotations

import json

import pytest
import yaml
from trace_testing import TAU2_FILES, run_cli, snapshot

from trace_cli.config.schemas import validate
from trace_cli.errors import UsageError, ValidationError
from trace_cli.stages.base import execute
from trace_cli.store import Store


@pytest.fixture(scope="module")
def shop_store(tmp_path_factory):
    """Rollouts on the shop env: `all_ok` (policy:reference, every episode succeeds) and `all_bad`
    (policy:random, every episode fails)."""
    root = tmp_path_factory.mktemp("diag") / "store"
    for model, name in (("policy:reference", "all_ok"), ("policy:random", "all_bad")):
        r = run_cli(
            "eval", "--model", model, "--env", "shop", "--seeds", "0:6", "--name", name, "--store", root
        )
        assert r.exit_code == 0, r.output
    return root


@pytest.fixture(scope="module")
def retail_store(tau2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("diag-tau2") / "store"
    r = run_cli("ingest", "tau2", tau2_dir / TAU2_FILES["retail"], "--name", "retail", "--store", root)
    assert r.exit_code == 0, r.output
    return root


def _expect_exit2(root, *args, match: str):
    before = snapshot(root)
    r = run_cli("diagnose", *args, "--store", root)
    assert r.exit_code == 2, r.output
    assert match in r.output, r.output
    assert snapshot(root) == before  # nothing written
    return r


def test_no_failures(shop_store):
    _expect_exit2(shop_store, "--rollouts", "store://rollouts/all_ok", match="no failures")
    r = _expect_exit2(
        shop_store,
        "--rollouts",
        "store://rollouts/all_ok",
        "--analyst",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--llm-model",
        "m",
        match="undefined",
    )
    assert "6 passed, 0 failed" in r.output


def test_no_successes(shop_store):
    _expect_exit2(shop_store, "--rollouts", "store://rollouts/all_bad", match="no successes")


@pytest.mark.parametrize(
    "args, match",
    [
        (["--coverage-min", "1.5"], "coverage_min"),
        (["--delta-min", "-0.1"], "delta_min"),
        (["--runs", "3", "--min-runs", "5"], "cannot exceed"),
        (["--runs", "0"], "runs"),
        (["--analyst", "oracle"], "oracle"),
        (["--capability", "telepathy"], "telepathy"),
        (["--candidates", "discover"], "discover needs an LLM analyst"),
        (["--candidates", "no/such/file.yaml"], "no such file"),
        (["--analyst", "openai"], "needs llm.base_url"),
        (["--analyst", "hf"], "needs llm.model"),
        (["--analyst", "hf", "--llm-model", "store://model/none"], "none"),
    ],
)
def test_bad_inputs_exit_2_and_write_nothing(retail_store, args, match):
    _expect_exit2(retail_store, "--rollouts", "store://rollouts/retail", *args, match=match)


def test_bad_inputs_at_the_stage_layer(retail_store):
    store = Store(retail_store)
    base = {"rollouts": "store://rollouts/retail"}
    with pytest.raises(ValidationError, match="analyst"):
        execute("diagnose", {**base, "analyst": "oracle"}, store)
    with pytest.raises(ValidationError, match="coverage_min"):
        execute("diagnose", {**base, "coverage_min": 1.01}, store)
    with pytest.raises(UsageError, match="cannot exceed"):
        execute("diagnose", {**base, "runs": 2, "min_runs": 3}, store)
    with pytest.raises(UsageError, match="not in the candidates"):
        execute("diagnose", {**base, "capabilities": ["telepathy"]}, store)
    assert not (retail_store / "diagnosis").exists()


def test_rules_on_tau2_retail(retail_store):
    r = run_cli("diagnose", "--rollouts", "store://rollouts/retail", "--json", "--store", retail_store)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["analyst"] == "rules" and out["episodes"] == {"failed": 6, "passed": 34}
    art = Store(retail_store).resolve(out["uri"])
    doc = yaml.safe_load((art.path / "capabilities.yaml").read_text())
    validate(doc, "diagnosis.v1.json", source="capabilities.yaml")
    validate(yaml.safe_load((art.path / "candidates.yaml").read_text()), "capabilities.v1.json")
    caps = doc["selected"] + doc["rejected"]
    assert len(caps) == 8
    for c in caps:
        assert c["runs_total"] == 10 and -1 <= c["mean_delta"] <= 1 and 0 <= c["mean_coverage"] <= 1
    assert all(c["runs_passed"] >= 8 for c in doc["selected"])
    assert [c["mean_delta"] for c in doc["selected"]] == sorted(
        (c["mean_delta"] for c in doc["selected"]), reverse=True
    )
    assert not any(c.get("distractor") for c in doc["selected"])  # distractors are rejected
    for c in doc["rejected"]:
        assert "reason" in c

    r = run_cli(
        "store",
        "sql",
        "select capability, label, count(*) as n from labels group by all",
        "--json",
        "--store",
        retail_store,
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {x["label"] for x in rows} <= {"NA", "PRESENT", "LACKING"}
    assert {x["capability"] for x in rows} == {c["name"] for c in caps}
    assert sum(x["n"] for x in rows) == 40 * 8 * 10  # episodes × capabilities × runs
    r = run_cli(
        "store", "sql", "select count(*) as n from capability_runs", "--json", "--store", retail_store
    )
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"n": 80}]

    # the table output, and an identical re-run is skipped
    r = run_cli("diagnose", "--rollouts", "store://rollouts/retail", "--store", retail_store)
    assert r.exit_code == 0 and "up to date" in r.output and "SELECTED" in r.output


def test_selection_by_agreement_across_bootstrap_seeds(retail_store):
    """The selection is repeated for `bootstrap_seeds` seeds; each capability reports how often it was selected
    (the share of single-seed diagnoses that select it) and is kept when that share reaches `agreement`."""
    st = Store(retail_store)
    base = {"rollouts": "store://rollouts/retail", "analyst": "rules"}

    arts = []

    def doc_of(**cfg):
        arts.append(execute("diagnose", {**base, **cfg}, st).main)
        return yaml.safe_load((arts[-1].path / "capabilities.yaml").read_text())

    singles = [doc_of(seed=b, bootstrap_seeds=1, coverage_min=0.3) for b in range(4)]
    agreed = doc_of(seed=0, bootstrap_seeds=4, agreement=0.5, coverage_min=0.3)
    assert agreed["thresholds"]["bootstrap_seeds"] == 4 and agreed["thresholds"]["agreement"] == 0.5
    for c in agreed["selected"] + agreed["rejected"]:
        n = sum(any(s["name"] == c["name"] for s in d["selected"]) for d in singles)
        assert c["selection_frequency"] == n / 4, c["name"]
        assert (c in agreed["selected"]) == (n >= 2)
    freqs = {c["selection_frequency"] for c in agreed["selected"] + agreed["rejected"]}
    assert freqs - {0.0, 1.0}, freqs  # the seeds disagree on some capability: agreement decides it
    assert {c["selection_frequency"] for d in singles for c in d["selected"] + d["rejected"]} <= {0.0, 1.0}
    # the whole choice's stability: the share of seeds whose selection is exactly the agreed set
    same = sum({c["name"] for c in d["selected"]} == {c["name"] for c in agreed["selected"]} for d in singles)
    assert arts[-1].summary["selection_set_agreement"] == same / 4 < 1
    assert arts[-1].summary["bootstrap_seeds"] == 4 and arts[0].summary["selection_set_agreement"] == 1.0
