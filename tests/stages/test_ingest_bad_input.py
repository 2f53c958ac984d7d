"""Bad input to `trace ingest`: exit 2, a message naming the record and field, and an untouched store.

`--on-error skip` writes the good records plus rejects.jsonl with the reasons.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from trace_testing import TAU2_FILES, episode, run_cli, snapshot, write_jsonl

from trace_cli.store import Store


@pytest.fixture(scope="module")
def tau2_small(tau2_dir) -> dict:
    """The real telecom results trimmed to three simulations (fast to parse, same shape)."""
    doc = json.loads((tau2_dir / TAU2_FILES["telecom"]).read_text())
    doc["simulations"] = doc["simulations"][:3]
    return doc


@pytest.fixture
def populated(tmp_path) -> Path:
    """A store that already holds one artifact (and its index), so 'unchanged' is a real check."""
    root = tmp_path / "store"
    f = write_jsonl(tmp_path / "good.jsonl", [episode("g1"), episode("g2", reward=0.0)])
    r = run_cli("ingest", "jsonl", f, "--name", "good", "--store", root)
    assert r.exit_code == 0, r.output
    return root


def _first_call_index(sim: dict) -> int:
    return next(i for i, m in enumerate(sim["messages"]) if m.get("tool_calls"))


def _set(d, keys, value):
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    return None


def _del(d, keys):
    for k in keys[:-1]:
        d = d[k]
    del d[keys[-1]]
    return None


def _args_not_object(d):
    sim = d["simulations"][0]
    sim["messages"][_first_call_index(sim)]["tool_calls"][0]["arguments"] = "order=5"


# name -> (mutation of the trimmed telecom document, or raw text; expected message fragments).
# A mutation returns None (the document was changed in place), a replacement object, or text to write as-is.
TAU2_CASES = {
    "truncated": (lambda d: json.dumps(d)[:20000], ["not valid JSON", "is the file truncated?"]),
    "not_an_object": (
        lambda d: [d],
        ["not a τ²-bench results file", "expected an object with `simulations`", "got array"],
    ),
    "missing_simulations": (
        lambda d: _del(d, ["simulations"]),
        ["expected an object with `simulations`", "got ['info', 'tasks'"],
    ),
    "empty_simulations": (lambda d: _set(d, ["simulations"], []), ["`simulations` is empty"]),
    "simulations_not_array": (
        lambda d: _set(d, ["simulations"], {"a": 1}),
        ["`simulations` must be an array, got object"],
    ),
    "simulation_not_object": (
        lambda d: _set(d, ["simulations", 1], 7),
        ["simulations[1]: expected an object, got int"],
    ),
    "reward_info_wrong_type": (
        lambda d: _set(d, ["simulations", 0, "reward_info"], [1.0]),
        ["simulations[0] (id {sim0}): reward_info: expected an object, got array"],
    ),
    "reward_not_number": (
        lambda d: _set(d, ["simulations", 1, "reward_info", "reward"], "1.0"),
        ["simulations[1] (id {sim1}): reward_info.reward: expected a number, got string"],
    ),
    "reward_boolean": (
        lambda d: _set(d, ["simulations", 1, "reward_info", "reward"], True),
        ["simulations[1] (id {sim1}): reward_info.reward: expected a number, got boolean"],
    ),
    "reward_wrong_type": (
        lambda d: _set(d, ["simulations", 2, "reward_info", "reward"], "1.0"),
        ["simulations[2] (id {sim2}): reward_info.reward: expected a number, got string"],
    ),
    "task_id_wrong_type": (
        lambda d: _set(d, ["simulations", 0, "task_id"], ["t1"]),
        ["simulations[0] (id {sim0}): task_id: not a string (got array)"],
    ),
    "trial_wrong_type": (
        lambda d: _set(d, ["simulations", 0, "trial"], "first"),
        ["simulations[0] (id {sim0}): trial: expected an integer or null, got string"],
    ),
    "duplicate_simulation_ids": (
        lambda d: _set(d, ["simulations", 2, "id"], d["simulations"][0]["id"]),
        ["simulations[2] (id {sim0}): id: duplicate of simulations[0]"],
    ),
    "messages_not_a_list": (
        lambda d: _set(d, ["simulations", 1, "messages"], "hello"),
        ["simulations[1] (id {sim1}): messages: expected an array, got string"],
    ),
    "bad_role": (
        lambda d: _set(d, ["simulations", 0, "messages", 1, "role"], "robot"),
        ["simulations[0] (id {sim0}): messages[1].role: 'robot' is not one of system/user/assistant/tool"],
    ),
    "arguments_not_object": (
        _args_not_object,
        [
            "simulations[0] (id {sim0}): messages[{call0}].tool_calls[0].arguments: expected an object, got string"
        ],
    ),
    "info_not_object": (lambda d: _set(d, ["info"], "gpt-4o"), ["info: expected an object, got string"]),
    "tasks_not_array": (lambda d: _set(d, ["tasks"], 3), ["tasks: expected an array, got int"]),
    "empty_file": (lambda d: "", ["the file is empty"]),
    "not_utf8": (lambda d: b"\xff\xfe\x00garbage", ["not a UTF-8 text file"]),
}


def _assert_rejected(store, args, needles):
    before = snapshot(store)
    r = run_cli(*args, "--store", store)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for n in needles:
        assert n in r.stderr, f"{n!r} not in:\n{r.stderr}"
    assert snapshot(store) == before, "a rejected ingest must leave the store exactly as it was"
    assert not list((store / ".tmp").glob("*")) if (store / ".tmp").exists() else True
    return r


@pytest.mark.parametrize("case", list(TAU2_CASES))
def test_bad_tau2(case, tau2_small, populated, tmp_path):
    mutate, needles = TAU2_CASES[case]
    doc = copy.deepcopy(tau2_small)
    fmt = {
        "sim0": doc["simulations"][0]["id"],
        "sim1": doc["simulations"][1]["id"],
        "sim2": doc["simulations"][2]["id"],
        "call0": _first_call_index(doc["simulations"][0]),
    }
    out = mutate(doc)
    f = tmp_path / f"{case}.json"
    if isinstance(out, bytes):
        f.write_bytes(out)
    elif isinstance(out, str):
        f.write_text(out)
    else:
        f.write_text(json.dumps(doc if out is None else out))
    r = _assert_rejected(populated, ["ingest", "tau2", f], [n.format(**fmt) for n in needles])
    assert str(f) in r.stderr


def test_bad_tau2_reports_every_bad_record(tau2_small, populated, tmp_path):
    doc = copy.deepcopy(tau2_small)
    doc["simulations"][0]["reward_info"] = "passed"
    doc["simulations"][2]["task_id"] = {"id": 1}
    doc["simulations"][2]["messages"][0]["role"] = "narrator"
    f = tmp_path / "two_bad.json"
    f.write_text(json.dumps(doc))
    r = _assert_rejected(
        populated,
        ["ingest", "tau2", f],
        [
            "2 bad records; nothing was written",
            f"simulations[0] (id {doc['simulations'][0]['id']}): reward_info: expected an object, got string",
            f"simulations[2] (id {doc['simulations'][2]['id']}): task_id: not a string (got object); "
            "messages[0].role: 'narrator'",
            "--on-error skip",
        ],
    )
    assert "simulations[1]" not in r.stderr


def _jsonl_types(recs):
    recs[1]["reward"] = "high"
    recs[1]["task_id"] = 1.5


def _jsonl_args(recs):
    recs[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] = 5


JSONL_CASES = {
    "truncated_line": (
        lambda recs: recs.__setitem__(1, json.dumps(recs[1])[:60]),
        ["line 2: not valid JSON", "truncated line?"],
    ),
    "missing_reward": (
        lambda recs: recs[1].pop("reward"),
        ["line 2 (episode_id e2)", "'reward' is a required property"],
    ),
    "missing_messages": (
        lambda recs: recs[2].pop("messages"),
        ["line 3 (episode_id e3)", "'messages' is a required property"],
    ),
    "wrong_types": (
        _jsonl_types,
        [
            "line 2 (episode_id e2): reward: 'high' is not of type 'number'",
            "task_id: 1.5 is not of type 'string', 'integer'",
        ],
    ),
    "success_not_boolean": (
        lambda recs: recs[0].__setitem__("success", "yes"),
        ["line 1 (episode_id e1): success: 'yes' is not of type 'boolean'"],
    ),
    "duplicate_episode_id": (
        lambda recs: recs[2].__setitem__("episode_id", "e1"),
        ["line 3 (episode_id e1): episode_id: duplicate 'e1' (first on line 1)"],
    ),
    "unknown_key": (
        lambda recs: recs[1].__setitem__("rewrd", 1),
        ["line 2 (episode_id e2): rewrd: unknown key"],
    ),
    "line_not_object": (
        lambda recs: recs.__setitem__(1, "[1, 2]"),
        ["line 2: <root>: [1, 2] is not of type 'object'"],
    ),
    "arguments_wrong_type": (
        _jsonl_args,
        [
            "line 2 (episode_id e2): messages[2].tool_calls[0].function.arguments: "
            "5 is not of type 'string', 'object'"
        ],
    ),
    "empty_messages": (
        lambda recs: recs[1].__setitem__("messages", []),
        ["line 2 (episode_id e2): messages: [] should be non-empty"],
    ),
    "bad_role": (
        lambda recs: recs[0]["messages"][1].__setitem__("role", "robot"),
        ["line 1 (episode_id e1): messages[1].role: 'robot' is not one of"],
    ),
    "tool_call_without_name": (
        lambda recs: recs[0]["messages"][2]["tool_calls"][0]["function"].pop("name"),
        ["line 1 (episode_id e1): messages[2].tool_calls[0].function", "'name' is a required property"],
    ),
}


@pytest.mark.parametrize("case", list(JSONL_CASES))
def test_bad_jsonl(case, populated, tmp_path):
    mutate, needles = JSONL_CASES[case]
    recs = [episode("e1"), episode("e2", reward=0.0), episode("e3")]
    mutate(recs)
    f = write_jsonl(tmp_path / f"{case}.jsonl", recs)
    r = _assert_rejected(populated, ["ingest", "jsonl", f], needles)
    assert f"{f}: 1 bad record; nothing was written" in r.stderr


@pytest.mark.parametrize("content", ["", "\n\n   \n"], ids=["empty", "blank_lines"])
def test_empty_jsonl(content, populated, tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text(content)
    _assert_rejected(populated, ["ingest", "jsonl", f], [f"{f}: the file is empty"])


@pytest.mark.parametrize("fmt", ["tau2", "jsonl"])
def test_missing_file_and_directory(fmt, populated, tmp_path):
    _assert_rejected(populated, ["ingest", fmt, tmp_path / "nope.json"], ["nope.json: no such file"])
    d = tmp_path / "a_dir"
    d.mkdir()
    # tau2 reads τ²-bench's per-run directory format, so a directory is checked for results.json
    want = "not a τ²-bench run directory (no results.json)" if fmt == "tau2" else "is a directory"
    _assert_rejected(populated, ["ingest", fmt, d], ["a_dir", want])


def test_jsonl_fed_to_tau2_and_binary_jsonl(populated, tmp_path):
    f = write_jsonl(tmp_path / "eps.jsonl", [episode("e1"), episode("e2")])
    _assert_rejected(
        populated, ["ingest", "tau2", f], ["eps.jsonl: looks like JSON Lines", "trace ingest jsonl"]
    )
    b = tmp_path / "bin.jsonl"
    b.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    _assert_rejected(populated, ["ingest", "jsonl", b], ["not a UTF-8 text file"])


def test_bad_input_into_a_fresh_store_creates_nothing(tmp_path):
    store = tmp_path / "fresh"
    f = write_jsonl(tmp_path / "x.jsonl", [{"task_id": "t"}])
    r = run_cli("ingest", "jsonl", f, "--store", store)
    assert r.exit_code == 2
    assert "line 1: " in r.stderr and "'messages' is a required property" in r.stderr
    assert not store.exists()


def test_on_error_skip_jsonl(populated, tmp_path):
    recs = [episode("e1"), episode("e2", reward=0.0), episode("e3"), episode("e4"), episode("e5")]
    del recs[1]["reward"]
    recs[3] = json.dumps(recs[3])[:40]
    f = write_jsonl(tmp_path / "mixed.jsonl", recs)
    r = run_cli("ingest", "jsonl", f, "--on-error", "skip", "--store", populated)
    assert r.exit_code == 0, r.output
    assert "2 rejected, 0 excluded; reasons in" in r.stderr
    # the summary table shows the rejected count
    header, values = [line for line in r.stdout.splitlines() if "│" in line or "┃" in line][:2]
    cols = [c.strip() for c in header.strip("┃ ").split("┃")]
    vals = [v.strip() for v in values.strip("│ ").split("│")]
    assert dict(zip(cols, vals, strict=True))["rejected"] == "2"
    assert dict(zip(cols, vals, strict=True))["episodes"] == "3"
    r = run_cli("ingest", "jsonl", f, "--on-error", "skip", "--json", "--store", populated)
    out = json.loads(r.stdout)
    assert out["skipped"] is True
    assert (out["summary"]["episodes"], out["summary"]["rejected"]) == (3, 2)
    art = Store(populated).resolve(out["id"])
    rejects = [json.loads(line) for line in (art.path / "rejects.jsonl").read_text().splitlines()]
    assert [x["where"] for x in rejects] == ["line 2 (episode_id e2)", "line 4"]
    assert rejects[0]["errors"] == ["<root>: 'reward' is a required property"]
    assert rejects[0]["record"]["episode_id"] == "e2"
    assert "not valid JSON" in rejects[1]["errors"][0]
    assert "rejects.jsonl" in [x["path"] for x in art.manifest["files"]]
    q = run_cli(
        "store",
        "sql",
        f"select episode_id from episodes where artifact_id = '{art.id}' order by 1",
        "--json",
        "--store",
        populated,
    )
    assert [x["episode_id"] for x in json.loads(q.stdout)] == ["e1", "e3", "e5"]
    assert run_cli("store", "verify", "--store", populated).exit_code == 0


def test_on_error_skip_tau2(tau2_small, populated, tmp_path):
    doc = copy.deepcopy(tau2_small)
    doc["simulations"][1]["reward_info"]["reward"] = "n/a"
    f = tmp_path / "one_bad.json"
    f.write_text(json.dumps(doc))
    r = run_cli("ingest", "tau2", f, "--on-error", "skip", "--json", "--store", populated)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["summary"]["episodes"], out["summary"]["rejected"]) == (2, 1)
    (rej,) = [json.loads(x) for x in (Path(out["path"]) / "rejects.jsonl").read_text().splitlines()]
    assert rej["where"] == f"simulations[1] (id {doc['simulations'][1]['id']})"
    assert rej["errors"] == ["reward_info.reward: expected a number, got string"]
    assert rej["record"]["id"] == doc["simulations"][1]["id"]


def test_on_error_skip_with_nothing_good_writes_nothing(populated, tmp_path):
    f = write_jsonl(tmp_path / "allbad.jsonl", ["{", '{"task_id": 1}'])
    _assert_rejected(
        populated, ["ingest", "jsonl", f, "--on-error", "skip"], ["no records to ingest (2 rejected)"]
    )
