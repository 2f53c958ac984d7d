"""Every τ²-bench results variant (checked against τ²-bench's pydantic model, src/tau2/data_model/simulation.py):
`trial: null`, no `task_id`, runs τ²-bench excludes (infrastructure_error, no reward_info), the policy, reasoning,
costs and timestamps, the per-run directory format, OpenAI's `developer` role, and pass^k of ingested rollouts."""

from __future__ import annotations

import copy
import json

import pytest
from trace_testing import TAU2_FILES, episode, run_cli, write_jsonl

from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes


@pytest.fixture(scope="module")
def retail(tau2_dir) -> dict:
    return json.loads((tau2_dir / TAU2_FILES["retail"]).read_text())


def _ingest(tmp_path, doc, *extra, name="x"):
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(doc))
    store = tmp_path / "store"
    r = run_cli("ingest", "tau2", f, "--name", name, "--json", "--store", store, *extra)
    return r, store


def _episodes(store, name="x"):
    art = Store(store).resolve(f"store://rollouts/{name}")
    return art, {e["episode_id"]: e for e in read_episodes(art.path)}


def test_trial_null_is_numbered_per_task(retail, tmp_path):
    doc = copy.deepcopy(retail)
    for s in doc["simulations"]:
        s["trial"] = None
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 0, r.output
    _, eps = _episodes(store)
    by_task: dict[str, list[int]] = {}
    for e in eps.values():
        by_task.setdefault(e["task_id"], []).append(e["trial"])
    assert all(sorted(t) == list(range(len(t))) for t in by_task.values())
    assert json.loads(r.stdout)["summary"]["episodes"] == len(doc["simulations"])


def test_missing_task_id_derived_stably_and_said(retail, tmp_path):
    doc = copy.deepcopy(retail)
    for s in doc["simulations"]:
        del s["task_id"]
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)["summary"]
    assert summary["derived_task_ids"] == len(doc["simulations"])
    _, eps = _episodes(store)
    assert all(e["task_id"].startswith("derived-") and e["info"]["task_id_derived"] for e in eps.values())
    # the same first user message gives the same id: runs of one task still group (pass^k is defined)
    r2, store2 = _ingest(tmp_path / "again", doc) if (tmp_path / "again").mkdir() is None else (None, None)
    _, eps2 = _episodes(store2)
    assert {k: e["task_id"] for k, e in eps.items()} == {k: e["task_id"] for k, e in eps2.items()}


def test_missing_task_id_from_the_simulation_index(retail, tmp_path):
    doc = copy.deepcopy(retail)
    doc["simulation_index"] = [
        {"id": s["id"], "task_id": s["task_id"], "trial": s["trial"]} for s in doc["simulations"]
    ]
    want = {s["id"]: str(s.pop("task_id")) for s in doc["simulations"]}
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 0, r.output
    _, eps = _episodes(store)
    assert {k: e["task_id"] for k, e in eps.items()} == want
    assert json.loads(r.stdout)["summary"]["derived_task_ids"] == 0


def test_infrastructure_errors_and_unscored_runs_are_excluded_not_fatal(retail, tmp_path):
    doc = copy.deepcopy(retail)
    infra, unscored = doc["simulations"][0], doc["simulations"][1]
    infra["termination_reason"] = "infrastructure_error"
    del unscored["reward_info"]
    r, store = _ingest(tmp_path, doc)  # default on_error: fail — exclusions are not errors
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)["summary"]
    assert summary["excluded"] == 2 and summary["rejected"] == 0
    assert summary["episodes"] == len(doc["simulations"]) - 2
    art, eps = _episodes(store)
    assert infra["id"] not in eps and unscored["id"] not in eps
    lines = [json.loads(x) for x in (art.path / "rejects.jsonl").read_text().splitlines()]
    assert [x["record"]["id"] for x in lines] == [infra["id"], unscored["id"]]
    assert all(x["excluded"] for x in lines)
    assert "infrastructure_error" in lines[0]["errors"][0] and "reward" in lines[1]["errors"][0]


def test_only_excluded_runs_is_a_clear_error(retail, tmp_path):
    doc = copy.deepcopy(retail)
    for s in doc["simulations"]:
        s["termination_reason"] = "infrastructure_error"
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 2 and "excluded as τ²-bench excludes them" in r.stderr
    assert not (store / "rollouts").exists()


def test_policy_reasoning_costs_and_timestamps_are_kept(retail, tmp_path):
    doc = copy.deepcopy(retail)
    doc["info"]["environment_info"]["policy"] = "# Retail agent policy\nBe kind."
    s0 = doc["simulations"][0]
    s0["agent_cost"], s0["user_cost"] = 0.0123, 0.004
    ai = next(i for i, m in enumerate(s0["messages"]) if m["role"] == "assistant")
    s0["messages"][ai]["raw_data"] = {
        "choices": [{"message": {"reasoning_content": "check the order first"}}]
    }
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 0, r.output
    _, eps = _episodes(store)
    e = eps[s0["id"]]
    assert e["messages"][0] == {"role": "system", "content": "# Retail agent policy\nBe kind."}
    assert e["messages"][ai + 1]["reasoning"] == "check the order first"
    assert e["info"]["agent_cost"] == 0.0123 and e["info"]["user_cost"] == 0.004
    for k in ("start_time", "end_time", "duration"):
        assert e["info"][k] == s0[k]


def test_directory_format(retail, tmp_path):
    """Results.save(format="dir"): results.json (info, tasks, simulation_index) + simulations/<id>.json."""
    run = tmp_path / "run"
    (run / "simulations").mkdir(parents=True)
    meta = {k: v for k, v in retail.items() if k != "simulations"}
    meta["simulation_index"] = [
        {"id": s["id"], "task_id": s["task_id"], "trial": s["trial"]} for s in retail["simulations"]
    ]
    (run / "results.json").write_text(json.dumps(meta))
    for s in retail["simulations"]:
        (run / "simulations" / f"{s['id']}.json").write_text(json.dumps(s))
    store = tmp_path / "store"
    r = run_cli("ingest", "tau2", run, "--name", "dir", "--json", "--store", store)
    assert r.exit_code == 0, r.output
    f = tmp_path / "single.json"
    f.write_text(json.dumps(retail))
    r2 = run_cli("ingest", "tau2", f, "--name", "single", "--json", "--store", store)
    _, a = _episodes(store, "dir")
    _, b = _episodes(store, "single")
    assert a.keys() == b.keys()
    assert all(a[k]["messages"] == b[k]["messages"] and a[k]["reward"] == b[k]["reward"] for k in a)
    assert json.loads(r.stdout)["summary"]["pass^k"] == json.loads(r2.stdout)["summary"]["pass^k"]
    # results.json given directly works too; an index naming a missing run is an error
    assert run_cli("ingest", "tau2", run / "results.json", "--store", tmp_path / "s2").exit_code == 0
    (run / "simulations" / f"{retail['simulations'][0]['id']}.json").unlink()
    bad = run_cli("ingest", "tau2", run, "--store", tmp_path / "s3")
    assert bad.exit_code == 2 and "simulation_index lists runs with no file" in bad.stderr


def test_pass_hat_k_of_ingested_rollouts_per_domain(retail, tmp_path, tau2_dir):
    r, store = _ingest(tmp_path, retail)
    summary = json.loads(r.stdout)["summary"]
    tasks: dict[str, list[bool]] = {}
    for s in retail["simulations"]:
        tasks.setdefault(str(s["task_id"]), []).append(abs(s["reward_info"]["reward"] - 1) <= 1e-6)
    k_max = min(len(v) for v in tasks.values())
    from math import comb

    want = {
        str(k): sum(comb(sum(v), k) / comb(len(v), k) for v in tasks.values()) / len(tasks)
        for k in range(1, k_max + 1)
    }
    assert summary["pass^k"] == pytest.approx(want)
    assert summary["domains"]["retail"]["pass^k"] == pytest.approx(want)
    rows = json.loads(
        run_cli("store", "sql", "select * from task_results", "--json", "--store", store).stdout
    )
    assert len(rows) == len(tasks)


def test_uneven_trials_lower_k_never_nan(retail, tmp_path):
    doc = copy.deepcopy(retail)
    counts: dict[str, int] = {}
    for s in doc["simulations"]:
        counts[s["task_id"]] = counts.get(s["task_id"], 0) + 1
    assert min(counts.values()) == 1
    for s in list(doc["simulations"]):  # every task gets a second and third run but one
        if s["task_id"] != doc["simulations"][0]["task_id"]:
            for t in (1, 2):
                doc["simulations"].append({**copy.deepcopy(s), "id": f"{s['id']}-{t}", "trial": t})
    r, _ = _ingest(tmp_path, doc)
    summary = json.loads(r.stdout)["summary"]
    assert set(summary["pass^k"]) == {"1"}  # k stops at the smallest trial count (1), as τ²-bench does
    assert all(v == v for d in summary["domains"].values() for v in d["pass^k"].values())


def test_jsonl_developer_role(tmp_path):
    rec = episode("d1")
    rec["messages"] = [{"role": "developer", "content": "You are terse."}, *rec["messages"]]
    f = write_jsonl(tmp_path / "dev.jsonl", [rec])
    store = tmp_path / "store"
    r = run_cli("ingest", "jsonl", f, "--name", "dev", "--store", store)
    assert r.exit_code == 0, r.output
    _, eps = _episodes(store, "dev")
    assert eps["d1"]["messages"][0] == {"role": "system", "content": "You are terse."}


def test_missing_task_id_from_the_files_only_task(retail, tmp_path):
    doc = copy.deepcopy(retail)
    only = doc["tasks"][0]
    doc["tasks"] = [only]
    for s in doc["simulations"]:
        del s["task_id"]
    r, store = _ingest(tmp_path, doc)
    assert r.exit_code == 0, r.output
    _, eps = _episodes(store)
    assert {e["task_id"] for e in eps.values()} == {str(only["id"])}
    assert json.loads(r.stdout)["summary"]["derived_task_ids"] == 0
