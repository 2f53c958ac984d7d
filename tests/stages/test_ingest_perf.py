"""The fast ingest path (orjson, no cyclic GC, bytes into Arrow, the compiled episode check) stores exactly what
the plain `json` path stores, and reports the same errors; JSONL lines end at "\\n" only. (The compiled check
itself is tested against jsonschema in tests/formats/test_schema_check.py.)"""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trace_testing import TAU2_FILES, episode, run_cli, write_jsonl

from trace_cli.formats import jsonl, tau2_read
from trace_cli.stages import ingest
from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes, string_array, tool_call_rows

BIG = 123456789012345678901234567890  # beyond 64 bits: orjson would read it as a float
SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


def _ingest(fmt: str, path: Path, store: Path, *extra: str) -> Path:
    r = run_cli("ingest", fmt, path, "--json", "--store", store, *extra)
    assert r.exit_code == 0, r.output
    return Store(store).resolve(json.loads(r.stdout)["id"]).path


def _tool_calls(art: Path) -> list[dict]:
    return pq.read_table(art / "tool_calls.parquet").to_pylist()


# ----------------------------------------------------------------------------- line splitting


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
def test_jsonl_line_separator_characters_inside_strings(sep, tmp_path, store):
    """JSON allows U+2028/U+2029/U+0085 raw in strings; str.splitlines() used to cut the record in three."""
    rec = episode("sep")
    rec["messages"][1]["content"] = f"first{sep}second"
    f = tmp_path / "sep.jsonl"
    f.write_text(
        json.dumps(episode("before"), ensure_ascii=False) + "\n" + json.dumps(rec, ensure_ascii=False) + "\n"
    )
    assert sep.encode() in f.read_bytes()  # raw, not escaped
    art = _ingest("jsonl", f, store)
    eps = {e["episode_id"]: e for e in read_episodes(art)}
    assert set(eps) == {"before", "sep"}
    assert eps["sep"]["messages"][1]["content"] == f"first{sep}second"
    # `trace validate` splits the same way
    r = run_cli("validate", f)
    assert r.exit_code == 0, r.output


def test_jsonl_line_numbers_crlf_and_other_separators(tmp_path, store):
    bad = episode("bad", reward="high")
    f = tmp_path / "crlf.jsonl"
    f.write_bytes(
        b"\r\n".join(json.dumps(r, ensure_ascii=False).encode() for r in [episode("a"), episode("b"), bad])
        + b"\r\n"
    )
    r = run_cli("ingest", "jsonl", f, "--store", store)
    assert r.exit_code == 2
    assert "line 3 (episode_id bad): reward: 'high' is not of type 'number'" in r.stderr
    f.write_bytes(f.read_bytes().replace(b"\r\n", b"\n", 1))  # mixed endings
    r = run_cli("validate", f)
    assert r.exit_code != 0 and "line 3: reward: 'high' is not of type 'number'" in r.output
    g = tmp_path / "ok.jsonl"
    g.write_bytes(b"".join(json.dumps(r).encode() + b"\r\n" for r in [episode("a"), episode("b")]))
    art = _ingest("jsonl", g, store)
    assert sorted(e["episode_id"] for e in read_episodes(art)) == ["a", "b"]


@pytest.mark.parametrize("sep", SEPARATORS)
def test_only_newline_ends_a_jsonl_line(sep, tmp_path, store):
    """A separator other than \\n between two records is part of one (invalid) line, in ingest and validate."""
    f = tmp_path / "two.jsonl"
    f.write_text(json.dumps(episode("a")) + sep + json.dumps(episode("b")) + "\n")
    r = run_cli("ingest", "jsonl", f, "--store", store)
    assert r.exit_code == 2 and "1 bad record" in r.stderr and "line 1: not valid JSON" in r.stderr
    r = run_cli("validate", f)
    assert r.exit_code != 0 and "line 1: invalid JSON" in r.output and "line 2" not in r.output


# ----------------------------------------------------------------------------- what orjson would change


def test_integers_beyond_64_bits_are_stored_exactly(tmp_path, store):
    assert type(orjson.loads(str(BIG))) is float  # why the fast path has to check
    rec = episode("big", seed=2**63 - 1)
    rec["messages"][2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"order_id": BIG})
    rec["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c2", "function": {"name": "pay", "arguments": {"amount": -BIG, "n": 2**64 - 1}}}
            ],
        }
    )
    rec["info"] = {"account": BIG, "ratio": 1e300, "neg": -(2**63)}
    f = write_jsonl(tmp_path / "big.jsonl", [episode("small"), rec])
    art = _ingest("jsonl", f, store)
    (ep,) = [e for e in read_episodes(art) if e["episode_id"] == "big"]
    assert ep["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"order_id": BIG}
    assert ep["messages"][-1]["tool_calls"][0]["function"]["arguments"] == {"amount": -BIG, "n": 2**64 - 1}
    assert ep["info"] == {"account": BIG, "ratio": 1e300, "neg": -(2**63)}
    assert ep["seed"] == 2**63 - 1
    args = {c["tool_name"]: json.loads(c["arguments"]) for c in _tool_calls(art) if c["episode_id"] == "big"}
    assert args == {"get_order": {"order_id": BIG}, "pay": {"amount": -BIG, "n": 2**64 - 1}}


def test_big_integer_task_id_and_non_standard_json(tmp_path, store):
    """`json` reads NaN/Infinity and big integers; such records are stored as before (NaN stays NaN)."""
    a = episode("a", task_id=None)
    a["task_id"] = BIG
    b = episode("b")
    b["info"] = {"score": float("nan"), "limit": float("inf")}
    b["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"x": NaN}'
    f = write_jsonl(tmp_path / "nan.jsonl", [a, b])
    assert b"NaN" in f.read_bytes() and b"Infinity" in f.read_bytes()
    art = _ingest("jsonl", f, store)
    eps = {e["episode_id"]: e for e in read_episodes(art)}
    assert eps["a"]["task_id"] == str(BIG)
    assert math.isnan(eps["b"]["info"]["score"]) and eps["b"]["info"]["limit"] == float("inf")
    assert math.isnan(eps["b"]["messages"][2]["tool_calls"][0]["function"]["arguments"]["x"])
    (row,) = [c for c in _tool_calls(art) if c["episode_id"] == "b"]
    assert row["arguments"] == '{"x": NaN}'


def test_big_integers_in_tau2(tau2_dir, tmp_path, store):
    doc = json.loads((tau2_dir / TAU2_FILES["telecom"]).read_text())
    doc["simulations"] = doc["simulations"][:2]
    sim = doc["simulations"][1]
    call = next(tc for m in sim["messages"] for tc in (m.get("tool_calls") or []))
    call["arguments"] = {"account": BIG}
    f = tmp_path / "big.json"
    f.write_text(json.dumps(doc))
    art = _ingest("tau2", f, store)
    ep = {e["episode_id"]: e for e in read_episodes(art)}[sim["id"]]
    calls = [tc for m in ep["messages"] for tc in (m.get("tool_calls") or [])]
    assert calls[0]["function"]["arguments"] == {"account": BIG}
    assert {"account": BIG} in [json.loads(c["arguments"]) for c in _tool_calls(art)]


def test_bad_record_with_a_big_integer_is_reported_exactly(tmp_path, store):
    rec = episode("x", trial=BIG)
    rec["domain"] = BIG
    f = write_jsonl(tmp_path / "x.jsonl", [episode("ok"), rec])
    r = run_cli("ingest", "jsonl", f, "--store", store)
    assert r.exit_code == 2 and f"domain: {BIG} is not of type 'string'" in r.stderr


# ----------------------------------------------------------------------------- error messages


def test_truncated_tau2_names_line_and_column(tau2_dir, tmp_path, store):
    text = json.dumps(json.loads((tau2_dir / TAU2_FILES["airline"]).read_text()), indent=1)[:50_000]
    f = tmp_path / "cut.json"
    f.write_text(text)
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(text)
    r = run_cli("ingest", "tau2", f, "--store", store)
    assert r.exit_code == 2
    assert (
        f"{f}:{e.value.lineno}:{e.value.colno}: not valid JSON ({e.value.msg}); is the file truncated?"
        in r.stderr
    )


@pytest.mark.parametrize("fmt", ["tau2", "jsonl"])
def test_non_utf8_names_the_first_bad_byte(fmt, tmp_path, store):
    good = json.dumps(episode("a"), ensure_ascii=False).encode()
    raw = good + b"\n" + good.replace(b"shop assistant", b"shop \xe9 assistant") + b"\n"
    f = tmp_path / f"latin1.{fmt}"
    f.write_bytes(raw)
    with pytest.raises(UnicodeDecodeError) as e:
        raw.decode("utf-8")
    r = run_cli("ingest", fmt, f, "--store", store, "--on-error", "skip")
    assert r.exit_code == 2
    assert f"{f}: not a UTF-8 text file (byte {e.value.start}: {e.value.reason}); expected JSON" in r.stderr


@pytest.mark.parametrize("fmt", ["tau2", "jsonl"])
@pytest.mark.parametrize(
    "content", ["", " \n\t\r\n", "\u00a0\n\u3000\n"], ids=["empty", "ascii_space", "unicode_space"]
)
def test_empty_file_message(fmt, content, tmp_path, store):
    f = tmp_path / f"e.{fmt}"
    f.write_text(content)
    r = run_cli("ingest", fmt, f, "--store", store)
    assert r.exit_code == 2 and f"{f}: the file is empty" in r.stderr


def test_bad_json_line_is_reported_as_json_reports_it(tmp_path, store):
    line = json.dumps(episode("b"))[:70]
    f = write_jsonl(tmp_path / "t.jsonl", [episode("a"), line])
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(line)
    r = run_cli("ingest", "jsonl", f, "--store", store)
    assert f"line 2: not valid JSON ({e.value.msg} at column {e.value.colno}); truncated line?" in r.stderr


# ----------------------------------------------------------------------------- fast and plain paths agree


def _json_value(v):
    """Stored JSON text (str or orjson's bytes) -> its value; other text as it is."""
    if isinstance(v, bytes):
        v = v.decode()
    try:
        return ("json", json.loads(v)) if isinstance(v, str) else v
    except json.JSONDecodeError:
        return v


def _decoded(good):
    """Records with their JSON text decoded, to compare values whatever the spacing or str/bytes."""
    return [
        (
            {k: _json_value(v) if k in ingest._TEXT_COLUMNS else v for k, v in ep.items()},
            [tuple(_json_value(x) if i in (4, 5) else x for i, x in enumerate(r)) for r in rows],
        )
        for ep, rows in good
    ]


def test_tau2_fast_and_plain_paths_agree(tau2_dir):
    for fname in TAU2_FILES.values():
        path = tau2_dir / fname
        fast = tau2_read.records(orjson.loads(path.read_bytes()), path, "s", fast=True)
        plain = tau2_read.records(json.loads(path.read_text()), path, "s", fast=False)
        assert not fast[1] and not plain[1]
        # exact: two JSON parsers on the same text (no float arithmetic)
        assert _decoded(fast[0]) == _decoded(plain[0])
        for ep, rows in fast[0]:
            assert isinstance(ep["messages"], bytes) and all(type(r[4]) in (bytes, str) for r in rows)
        for ep, _ in plain[0]:
            assert isinstance(ep["messages"], str)


def test_jsonl_fast_and_plain_paths_agree():
    recs = [
        episode("a"),
        episode("b", tools=[{"type": "function", "function": {"name": "f"}}], info={"env": "x"}),
    ]
    recs[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{not json"
    recs[1]["messages"].append({"role": "tool", "content": "orphan", "error": True})
    for i, rec in enumerate(recs, start=1):
        line = json.dumps(rec).encode()
        fast = jsonl.read_record(orjson.loads(line), i, "s", {}, fast=True)
        plain = jsonl.read_record(json.loads(line), i, "s", {}, fast=False)
        # exact: two JSON parsers on the same text (no float arithmetic)
        assert _decoded([fast]) == _decoded([plain])


def test_ordinary_records_take_the_fast_path(tmp_path, store):
    """orjson's compact JSON in the stored columns shows the fast path was taken (not the `json` redo)."""
    f = write_jsonl(tmp_path / "a.jsonl", [episode("a"), episode("b", info={"k": [1, 2.5]})])
    art = _ingest("jsonl", f, store)
    raw = pq.read_table(art / "episodes.parquet").to_pylist()
    assert all('"role":"system"' in r["messages"] for r in raw)
    assert {r["episode_id"]: r["info"] for r in raw} == {"a": None, "b": '{"k":[1,2.5]}'}
    assert {c["arguments"] for c in _tool_calls(art)} == {'{"order_id":"#12"}'}


def test_run_restores_the_garbage_collector(tmp_path, store):
    f = write_jsonl(tmp_path / "a.jsonl", [episode("a")])
    assert gc.isenabled()
    _ingest("jsonl", f, store)
    assert gc.isenabled()
    gc.disable()
    try:
        _ingest("jsonl", write_jsonl(tmp_path / "b.jsonl", [episode("b")]), store)
        assert not gc.isenabled()
    finally:
        gc.enable()
    bad = write_jsonl(tmp_path / "c.jsonl", ["{"])
    assert run_cli("ingest", "jsonl", bad, "--store", store).exit_code == 2
    assert gc.isenabled()


def test_string_array_matches_pa_array():
    for vals in ([b"a", "b\u2028", None, b""], [], [None, None], ["x"] * 3, [b'{"k":1}'] * 5):
        assert string_array(vals).equals(pa.array(vals, pa.string()))
    for vals in ([b"\xff"], ["\ud800"], [1]):
        with pytest.raises(Exception) as got:
            string_array(vals)
        with pytest.raises(Exception) as want:
            pa.array(vals, pa.string())
        assert type(got.value) is type(want.value)


def test_tool_call_rows_keep_their_json_text():
    msgs = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"q": "é"}}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": ["x", 1]},
    ]
    (row,) = tool_call_rows("e", msgs)
    assert row == {
        "episode_id": "e",
        "turn": 0,
        "call_index": 0,
        "tool_name": "f",
        "arguments": '{"q": "é"}',
        "result": '["x", 1]',
        "error": False,
        "requestor": "assistant",
    }
