"""`trace export tau2|jsonl`: τ²-bench-valid files, and ingest(export(x)) == x for episodes and tool calls."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from tau2_models import Results
from trace_testing import TAU2_FILES, run_cli, snapshot

from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes

EP_KEYS = ("episode_id", "task_id", "trial", "seed", "reward", "success", "n_tool_calls")
CALL_KEYS = ("episode_id", "turn", "call_index", "tool_name", "arguments", "result", "error", "requestor")


def _ok(*args):
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    return r


def _ingest(store, fmt, path, name):
    out = json.loads(_ok("ingest", fmt, path, "--name", name, "--json", "--store", store).stdout)
    return Store(store).resolve(out["uri"], kind="rollouts")


def _calls(art):
    rows = pq.read_table(art.path / "tool_calls.parquet").to_pylist()
    # arguments are JSON text; ingest of orjson-parsed files writes it compact: compare the values
    return sorted(
        (tuple(r[k] if k != "arguments" else json.loads(r[k]) for k in CALL_KEYS) for r in rows),
        key=lambda t: json.dumps(t, sort_keys=True, default=str),
    )


def _episodes(art):
    return {e["episode_id"]: e for e in read_episodes(art.path)}


def _same(a, b, *, messages: bool):
    ea, eb = _episodes(a), _episodes(b)
    assert sorted(ea) == sorted(eb)
    for eid, e in ea.items():
        assert {k: e[k] for k in EP_KEYS} == {k: eb[eid][k] for k in EP_KEYS}, eid
        if messages:
            assert e["messages"] == eb[eid]["messages"], eid
    assert _calls(a) == _calls(b)
    sa, sb = a.summary, b.summary
    assert (sa["episodes"], sa["successes"], sa["tool_calls"]) == (
        sb["episodes"],
        sb["successes"],
        sb["tool_calls"],
    )


def _plain(msgs, *drop):
    out = []
    for m in msgs:
        m = {k: v for k, v in m.items() if k not in ("requestor", *drop)}
        if m.get("tool_calls"):
            m["tool_calls"] = [{k: v for k, v in tc.items() if k != "requestor"} for tc in m["tool_calls"]]
        out.append(m)
    return out


def _shop_rollouts(store, model, seeds="0:6"):
    out = json.loads(
        _ok("eval", "--model", model, "--env", "shop", "--seeds", seeds, "--json", "--store", store).stdout
    )
    return Store(store).resolve(out["rollouts"], kind="rollouts")


@pytest.mark.parametrize("domain", sorted(TAU2_FILES))
def test_tau2_file_round_trip(domain, tau2_dir, tmp_path):
    """ingest τ²-bench -> export tau2 -> ingest: same episodes, messages, successes, tool calls."""
    store = tmp_path / "store"
    first = _ingest(store, "tau2", tau2_dir / TAU2_FILES[domain], "a")
    out = tmp_path / "export.json"
    counts = json.loads(_ok("export", "tau2", "a", "--out", out, "--json", "--store", store).stdout)
    assert counts["simulations"] == first.summary["episodes"]
    doc = json.loads(out.read_text())
    Results.model_validate(doc)  # τ²-bench's own model semantics
    original = json.loads((tau2_dir / TAU2_FILES[domain]).read_text())
    assert (
        doc["info"]["environment_info"]["domain_name"] == original["info"]["environment_info"]["domain_name"]
    )
    assert doc["info"]["environment_info"]["policy"] == original["info"]["environment_info"]["policy"]
    second = _ingest(store, "tau2", out, "b")
    _same(first, second, messages=True)
    for e in _episodes(second).values():  # what ingest keeps of the run survives too
        assert e["domain"] == original["info"]["environment_info"]["domain_name"]


def test_every_vendored_tau2_file_comes_back_as_it_was(tau2_dir, tmp_path):
    """ingest -> export of each τ²-bench results file in examples/tau2/ gives the same JSON document (every
    key and value: tasks with their initial_state and user_tools, info with max_steps, seed and the user
    LLM, action ids, reward_info details, per-message cost, usage, timestamps and raw_data)."""
    files = sorted(tau2_dir.glob("results_*.json"))
    assert len(files) >= 3
    store = tmp_path / "store"
    for i, path in enumerate(files):
        _ingest(store, "tau2", path, f"v{i}")
        out = tmp_path / f"v{i}.json"
        _ok("export", "tau2", f"v{i}", "--out", out, "--store", store)
        original, doc = json.loads(path.read_text()), json.loads(out.read_text())
        assert doc["tasks"] == original["tasks"], path.name
        assert doc["info"] == original["info"], path.name
        for a, b in zip(doc["simulations"], original["simulations"], strict=True):
            assert a == b, (path.name, a["id"])
        assert doc == original, path.name


def test_runs_tau2_excludes_come_back_in_place(tau2_dir, tmp_path):
    """Runs τ²-bench leaves out of its metrics are not episodes, yet the exported file has them, in place."""
    original = json.loads((tau2_dir / TAU2_FILES["telecom"]).read_text())
    original["simulations"][3]["termination_reason"] = "infrastructure_error"
    original["simulations"][7]["reward_info"] = None
    path = tmp_path / "with_excluded.json"
    path.write_text(json.dumps(original))
    store = tmp_path / "store"
    art = _ingest(store, "tau2", path, "x")
    assert art.summary["episodes"] == len(original["simulations"]) - 2
    out = tmp_path / "x.json"
    _ok("export", "tau2", "x", "--out", out, "--store", store)
    assert json.loads(out.read_text()) == original


def test_shop_eval_round_trip_tau2(tmp_path):
    """An eval of the shop world (tool errors included) -> τ²-bench JSON -> ingest keeps episodes and calls."""
    store = tmp_path / "store"
    arts = [_shop_rollouts(store, "policy:reference"), _shop_rollouts(store, "policy:random", "0:4")]
    for i, first in enumerate(arts):
        out = tmp_path / f"shop{i}.json"
        _ok("export", "tau2", first.uri, "--out", out, "--store", store)
        doc = json.loads(out.read_text())
        res = Results.model_validate(doc)
        for sim in res.simulations:
            for m in sim.messages:
                if m.role in ("user", "assistant"):
                    m.validate_content()
        sig = doc["info"]["environment_info"]["tool_defs"]
        assert "get_order_details" in sig and sig["get_order_details"]["params"]["type"] == "object"
        second = _ingest(store, "tau2", out, f"shop{i}")
        _same(first, second, messages=False)
        ea, eb = _episodes(first), _episodes(second)
        for eid, e in ea.items():
            # the system prompt comes back from the policy; tool results lose only the tool name, and
            # τ²-bench's default requestor ("assistant") is now explicit
            assert _plain(e["messages"], "name") == _plain(eb[eid]["messages"])
            # one tool_defs per τ²-bench file: each episode gets the union of the tools its family had
            assert all(t in eb[eid]["tools"] for t in e["tools"])
    assert any(r[6] for r in _calls(arts[1])), "the random policy should have produced tool errors"


def test_jsonl_round_trip(tau2_dir, tmp_path):
    """export jsonl -> ingest jsonl: same episodes, messages, env and family, tool calls (τ²-bench and shop)."""
    store = tmp_path / "store"
    firsts = [
        _ingest(store, "tau2", tau2_dir / TAU2_FILES["telecom"], "tel"),
        _shop_rollouts(store, "policy:random", "0:4"),
    ]
    for i, first in enumerate(firsts):
        out = tmp_path / f"e{i}.jsonl"
        _ok("export", "jsonl", first.uri, "--out", out, "--store", store)
        lines = out.read_text().splitlines()
        assert len(lines) == first.summary["episodes"]
        recs = [json.loads(line) for line in lines]
        calls = [tc for r in recs for m in r["messages"] for tc in m.get("tool_calls") or []]
        assert calls and all(isinstance(tc["function"]["arguments"], str) for tc in calls)  # OpenAI format
        second = _ingest(store, "jsonl", out, f"j{i}")
        _same(first, second, messages=False)
        ea, eb = _episodes(first), _episodes(second)
        for eid, e in ea.items():
            assert _plain(e["messages"]) == _plain(eb[eid]["messages"])  # OpenAI calls carry no requestor
            assert (eb[eid]["env"], eb[eid]["task_family"], eb[eid]["domain"]) == (
                e["env"],
                e["task_family"],
                e["domain"],
            )
            assert eb[eid]["tools"] == e["tools"]


def test_export_errors_write_nothing(tmp_path, tau2_dir):
    store = tmp_path / "store"
    _ingest(store, "tau2", tau2_dir / TAU2_FILES["airline"], "air")
    out = tmp_path / "x.json"
    out.write_text("keep")
    r = run_cli("export", "tau2", "air", "--out", out, "--store", store)
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
    assert out.read_text() == "keep"
    _ok("export", "tau2", "air", "--out", out, "--force", "--store", store)
    assert json.loads(out.read_text())["simulations"]
    before = snapshot(tmp_path)
    for args in (
        ("export", "tau2", "nope", "--out", tmp_path / "y.json"),
        ("export", "jsonl", "air", "--out", tmp_path / "missing" / "y.jsonl"),
        ("export", "jsonl", "air", "--out", tmp_path),
        ("export", "tau2", "store://model/air", "--out", tmp_path / "z.json"),
    ):
        r = run_cli(*args, "--store", store)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error: ") and "\n" == r.output[-1] and r.output.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_messages_without_ids_and_raw_arguments():
    """Calls without ids get one their result names; raw-text arguments become {} and are counted."""
    from trace_cli.formats import tau2

    msgs = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "think",
            "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
                {"type": "function", "function": {"name": "b", "arguments": "{not json"}},
            ],
        },
        {"role": "tool", "content": "ra"},
        {"role": "tool", "content": {"v": 2}, "error": True},
        {"role": "developer", "content": "later"},
    ]
    policy, out, lossy = tau2.messages(msgs)
    assert policy == "policy" and lossy == 1
    calls = out[1]["tool_calls"]
    assert [c["arguments"] for c in calls] == [{"x": 1}, {}]
    assert [out[2]["id"], out[3]["id"]] == [calls[0]["id"], calls[1]["id"]]
    assert out[3]["content"] == '{"v": 2}' and out[3]["error"] is True
    assert out[1]["raw_data"]["choices"][0]["message"]["reasoning_content"] == "think"
    assert out[4]["role"] == "system"
    assert tau2.termination("max_turns") == "max_steps" and tau2.termination("transfer") == "agent_stop"
