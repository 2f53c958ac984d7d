"""`trace ingest jsonl`: OpenAI chat episodes (tool_calls with string arguments, tool results by tool_call_id)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from trace_testing import episode, run_cli, write_jsonl

from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes, tool_call_rows


def test_jsonl_happy_path(tmp_path, store):
    multi = episode(
        "ep-2",
        task_id=7,
        reward=0.0,
        success=False,
        domain="shop",
        trial=1,
        seed=42,
        termination_reason="max_steps",
    )
    multi["messages"].insert(
        3,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "x1",
                    "type": "function",
                    "function": {"name": "refund", "arguments": '{"amount": 3}'},
                },
                {"id": "x2", "type": "function", "function": {"name": "notify", "arguments": ""}},
            ],
        },
    )
    # results arrive out of order; pairing is by tool_call_id
    multi["messages"].insert(4, {"role": "tool", "tool_call_id": "x2", "content": "notified"})
    multi["messages"].insert(
        5, {"role": "tool", "tool_call_id": "x1", "content": "insufficient funds", "error": True}
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_order",
                "description": "Look up an order",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    f = write_jsonl(tmp_path / "eps.jsonl", [episode("ep-1", tools=tools), "", multi])
    r = run_cli("ingest", "jsonl", f, "--name", "mine", "--json", "--store", store)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    summary = out["summary"]
    assert {k: summary[k] for k in ("episodes", "successes", "failures", "tool_calls", "rejected")} == {
        "episodes": 2,
        "successes": 1,
        "failures": 1,
        "tool_calls": 4,
        "rejected": 0,
    }
    assert (summary["format"], summary["source"], summary["excluded"]) == ("jsonl", "eps.jsonl", 0)
    assert summary["pass@1"] == 0.5 and summary["pass^k"] == {"1": 0.5}
    art = Store(store).resolve("store://rollouts/mine")
    assert art.id == out["id"]
    assert not (art.path / "rejects.jsonl").exists()
    eps = {e["episode_id"]: e for e in read_episodes(art.path)}
    e1, e2 = eps["ep-1"], eps["ep-2"]
    assert (e1["task_id"], e1["reward"], e1["success"], e1["n_turns"], e1["n_tool_calls"]) == (
        "t1",
        1.0,
        True,
        2,
        1,
    )
    assert e1["tools"] == tools
    assert (
        e2["task_id"],
        e2["success"],
        e2["domain"],
        e2["trial"],
        e2["seed"],
        e2["termination_reason"],
    ) == ("7", False, "shop", 1, 42, "max_steps")
    # string arguments are decoded into objects in the stored messages
    call = e1["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "get_order", "arguments": {"order_id": "#12"}}
    calls = pq.read_table(art.path / "tool_calls.parquet").to_pylist()
    by = {(c["episode_id"], c["tool_name"]): c for c in calls}
    assert json.loads(by["ep-1", "get_order"]["arguments"]) == {"order_id": "#12"}
    assert by["ep-1", "get_order"]["result"] == '{"status": "shipped"}'
    assert by["ep-2", "refund"]["result"] == "insufficient funds" and by["ep-2", "refund"]["error"] is True
    assert by["ep-2", "notify"]["result"] == "notified" and by["ep-2", "notify"]["error"] is False
    assert json.loads(by["ep-2", "notify"]["arguments"]) == {}
    assert {c["requestor"] for c in calls} == {"assistant"}
    assert (by["ep-2", "refund"]["turn"], by["ep-2", "refund"]["call_index"]) == (3, 0)
    assert (by["ep-2", "notify"]["turn"], by["ep-2", "notify"]["call_index"]) == (3, 1)
    # and the index sees it
    r = run_cli(
        "store",
        "sql",
        "select tool_name, count(*) as n from tool_calls group by 1 order by 1",
        "--json",
        "--store",
        store,
    )
    assert json.loads(r.stdout) == [
        {"tool_name": "get_order", "n": 2},
        {"tool_name": "notify", "n": 1},
        {"tool_name": "refund", "n": 1},
    ]


def test_success_defaults_from_reward_and_ids_are_generated(tmp_path, store):
    recs = [episode("x", reward=1.0), episode("y", reward=0.999), episode("z", reward=1 - 1e-9)]
    for r in recs:
        del r["episode_id"]
    f = write_jsonl(tmp_path / "noid.jsonl", recs)
    r = run_cli("ingest", "jsonl", f, "--source", "agent-v2", "--json", "--store", store)
    assert r.exit_code == 0, r.output
    eps = read_episodes(Store(store).resolve(json.loads(r.stdout)["id"]).path)
    assert [e["success"] for e in eps] == [True, False, True]
    assert len({e["episode_id"] for e in eps}) == 3
    assert {e["source"] for e in eps} == {"agent-v2"}


def test_malformed_arguments_string_is_kept_raw(tmp_path, store):
    rec = episode("bad-args")
    rec["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"order_id": '
    f = write_jsonl(tmp_path / "raw.jsonl", [rec])
    r = run_cli("ingest", "jsonl", f, "--json", "--store", store)
    assert r.exit_code == 0, r.output
    art = Store(store).resolve(json.loads(r.stdout)["id"])
    (row,) = pq.read_table(art.path / "tool_calls.parquet").to_pylist()
    assert row["arguments"] == '{"order_id": '


def test_tool_call_rows_pairing_does_not_steal_another_calls_result():
    """A call whose result is missing must not take the result that belongs (by id) to a later call."""
    msgs = [
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]},
        {"role": "assistant", "tool_calls": [{"id": "b", "function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "b", "content": "result of b"},
    ]
    rows = tool_call_rows("e", msgs)
    assert [(r["tool_name"], r["result"]) for r in rows] == [("f", None), ("g", "result of b")]


def test_tool_call_rows_pairs_id_less_results_in_order():
    msgs = [
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "f", "arguments": {}}},
                {"function": {"name": "g", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "rf"},
        {"role": "tool", "content": "rg"},
    ]
    rows = tool_call_rows("e", msgs)
    assert [(r["tool_name"], r["result"]) for r in rows] == [("f", "rf"), ("g", "rg")]


def test_force_reingests_in_place(tmp_path, store):
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1"), episode("e2", reward=0.0)])
    first = json.loads(run_cli("ingest", "jsonl", f, "--name", "mine", "--json", "--store", store).stdout)
    again = json.loads(run_cli("ingest", "jsonl", f, "--json", "--store", store).stdout)
    assert again["skipped"] is True and again["id"] == first["id"]
    r = run_cli("ingest", "jsonl", f, "--force", "--json", "--store", store)
    assert r.exit_code == 0, r.output
    forced = json.loads(r.stdout)
    assert forced["skipped"] is False and forced["id"] == first["id"]
    st = Store(store)
    assert [a.id for a in st.list()] == [first["id"]] and st.resolve("mine").id == first["id"]
    assert run_cli("store", "verify", "--store", store).exit_code == 0
    q = run_cli("store", "sql", "select count(*) as n from episodes", "--json", "--store", store)
    assert json.loads(q.stdout) == [{"n": 2}]
    # another file name is another source label -> another artifact; same name and content elsewhere -> the same one
    g = write_jsonl(tmp_path / "copy.jsonl", [episode("e1"), episode("e2", reward=0.0)])
    assert json.loads(run_cli("ingest", "jsonl", g, "--json", "--store", store).stdout)["skipped"] is False
    h = tmp_path / "sub" / "copy.jsonl"
    h.parent.mkdir()
    h.write_bytes(g.read_bytes())
    assert json.loads(run_cli("ingest", "jsonl", h, "--json", "--store", store).stdout)["skipped"] is True
