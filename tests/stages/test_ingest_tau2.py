"""`trace ingest tau2` on the three real τ²-bench results files vendored in examples/tau2."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from trace_testing import TAU2_FILES, run_cli

from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes

# (simulations, successes) as documented in the data README
EXPECTED = {"retail": (40, 34), "airline": (20, 10), "telecom": (20, 14)}


def _file_counts(path):
    doc = json.loads(path.read_text())
    sims = doc["simulations"]
    tasks = {str(t["id"]): t for t in doc["tasks"]}
    n_calls = sum(len(m.get("tool_calls") or []) for s in sims for m in s["messages"])
    n_user_calls = sum(
        len(m.get("tool_calls") or []) for s in sims for m in s["messages"] if m["role"] == "user"
    )
    with_actions = {
        s["id"]
        for s in sims
        if ((tasks.get(str(s["task_id"])) or {}).get("evaluation_criteria") or {}).get("actions")
    }
    return len(sims), n_calls, n_user_calls, with_actions, doc


@pytest.fixture(scope="module")
def ingested(tau2_dir, tmp_path_factory):
    """One store holding all three files, ingested through the CLI."""
    root = tmp_path_factory.mktemp("tau2") / "store"
    uris = {}
    for domain, fname in TAU2_FILES.items():
        r = run_cli("ingest", "tau2", tau2_dir / fname, "--name", f"tau2-{domain}", "--json", "--store", root)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["skipped"] is False
        uris[domain] = out
    return root, uris


def _sql(root, query):
    r = run_cli("store", "sql", query, "--json", "--store", root)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_episode_counts_match_simulations(ingested, tau2_dir):
    root, _ = ingested
    total = sum(_file_counts(tau2_dir / f)[0] for f in TAU2_FILES.values())
    assert total == 80
    rows = _sql(root, "select count(*) as n from episodes")
    assert rows == [{"n": total}]
    # the default table output reports the same count
    r = run_cli("store", "sql", "select count(*) from episodes", "--store", root)
    assert r.exit_code == 0 and "80" in r.stdout


@pytest.mark.parametrize("domain", list(TAU2_FILES))
def test_per_file_counts(ingested, tau2_dir, domain):
    root, uris = ingested
    n_sims, n_calls, n_user_calls, _, doc = _file_counts(tau2_dir / TAU2_FILES[domain])
    n_expected, succ_expected = EXPECTED[domain]
    assert n_sims == n_expected
    aid = uris[domain]["id"]
    rows = _sql(
        root,
        f"select count(*) as n, count(*) filter (where success) as s, "
        f"count(distinct episode_id) as ids, min(domain) as domain from episodes where artifact_id = '{aid}'",
    )
    assert rows == [{"n": n_expected, "s": succ_expected, "ids": n_expected, "domain": domain}]
    calls = _sql(root, f"select count(*) as n from tool_calls where artifact_id = '{aid}'")
    assert calls == [{"n": n_calls}]
    summary = uris[domain]["summary"]
    assert (summary["episodes"], summary["successes"], summary["tool_calls"], summary["rejected"]) == (
        n_expected,
        succ_expected,
        n_calls,
        0,
    )
    # the per-episode tool-call count agrees with the tool_calls table
    per_ep = _sql(
        root,
        f"select e.episode_id, e.n_tool_calls, count(t.episode_id) as c from episodes e "
        f"left join tool_calls t using (episode_id) where e.artifact_id = '{aid}' group by all "
        f"having e.n_tool_calls <> count(t.episode_id)",
    )
    assert per_ep == []
    # every simulation id appears with its reward
    want = {s["id"]: s["reward_info"]["reward"] for s in doc["simulations"]}
    got = {
        r["episode_id"]: r["reward"]
        for r in _sql(root, f"select episode_id, reward from episodes where artifact_id = '{aid}'")
    }
    assert got == pytest.approx(want)


def test_tool_call_counts_are_the_documented_ones(tau2_dir):
    counts = {d: _file_counts(tau2_dir / f)[1] for d, f in TAU2_FILES.items()}
    assert counts == {"retail": 299, "airline": 148, "telecom": 215}


def test_tool_results_are_paired(ingested):
    root, _ = ingested
    rows = _sql(
        root,
        "select count(*) as n, count(result) as with_result, count(*) filter (where error) as errors from tool_calls",
    )
    n, with_result = rows[0]["n"], rows[0]["with_result"]
    assert n == 299 + 148 + 215
    assert with_result >= 0.95 * n
    # a paired result is the tool message answering that call, e.g. a lookup by email returns a user id
    sample = _sql(
        root,
        "select arguments, result from tool_calls where tool_name = 'find_user_id_by_email' and result is not null limit 5",
    )
    assert sample
    for r in sample:
        assert "email" in json.loads(r["arguments"])
        assert r["result"]


def test_requestor_column(ingested, tau2_dir):
    root, uris = ingested
    _, _, n_user_calls, _, _ = _file_counts(tau2_dir / TAU2_FILES["telecom"])
    assert n_user_calls > 0
    rows = _sql(
        root,
        f"select requestor, count(*) as n from tool_calls where artifact_id = '{uris['telecom']['id']}' group by all order by 1",
    )
    by = {r["requestor"]: r["n"] for r in rows}
    assert by["user"] == n_user_calls
    assert by["assistant"] == 215 - n_user_calls
    for domain in ("retail", "airline"):
        rows = _sql(
            root, f"select distinct requestor from tool_calls where artifact_id = '{uris[domain]['id']}'"
        )
        assert rows == [{"requestor": "assistant"}]


def test_reference_actions(ingested, tau2_dir):
    root, uris = ingested
    for domain, fname in TAU2_FILES.items():
        _, _, _, with_actions, doc = _file_counts(tau2_dir / fname)
        assert with_actions, domain
        art = Store(root).resolve(uris[domain]["id"])
        eps = {e["episode_id"]: e for e in read_episodes(art.path)}
        tasks = {str(t["id"]): t for t in doc["tasks"]}
        for s in doc["simulations"]:
            ep = eps[s["id"]]
            if s["id"] in with_actions:
                want = tasks[str(s["task_id"])]["evaluation_criteria"]["actions"]
                assert [a["name"] for a in ep["reference_actions"]] == [a["name"] for a in want]
                assert [a["arguments"] for a in ep["reference_actions"]] == [a["arguments"] for a in want]
            else:
                assert ep["reference_actions"] is None


def test_parquet_tables_and_messages(ingested):
    root, uris = ingested
    art = Store(root).resolve("store://rollouts/tau2-retail")
    assert art.id == uris["retail"]["id"]
    ep = pq.read_table(art.path / "episodes.parquet")
    tc = pq.read_table(art.path / "tool_calls.parquet")
    assert ep.num_rows == 40 and tc.num_rows == 299
    for col in (
        "episode_id",
        "source",
        "domain",
        "task_id",
        "trial",
        "seed",
        "reward",
        "success",
        "termination_reason",
        "n_turns",
        "messages",
        "reference_actions",
    ):
        assert col in ep.column_names
    for col in ("episode_id", "turn", "tool_name", "arguments", "result", "error", "requestor"):
        assert col in tc.column_names
    first = read_episodes(art.path)[0]
    assert first["source"] == "results_gpt-4.1_retail_test.json"
    roles = {m["role"] for m in first["messages"]}
    assert {"assistant", "user", "tool"} <= roles
    calls = [tc for m in first["messages"] for tc in m.get("tool_calls") or []]
    assert calls and all(isinstance(c["function"]["arguments"], dict) for c in calls)


def test_reingest_is_skipped(ingested, tau2_dir):
    root, uris = ingested
    r = run_cli("ingest", "tau2", tau2_dir / TAU2_FILES["airline"], "--json", "--store", root)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["skipped"] is True and out["id"] == uris["airline"]["id"]
    assert len(Store(root).list()) == 3
