"""The fast ingest path (orjson, no cyclic GC, bytes into Arrow, `_fast_valid`) stores exactly what the plain
`json` path stores, and reports the same errors; JSONL lines end at "\\n" only."""

from __future__ import annotations

import copy
import gc
import json
import math
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_testing import TAU2_FILES, episode, run_cli, write_jsonl

from trace_cli.config.schemas import _validator
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
        fast = ingest._tau2_records(orjson.loads(path.read_bytes()), path, "s", fast=True)
        plain = ingest._tau2_records(json.loads(path.read_text()), path, "s", fast=False)
        assert not fast[1] and not plain[1]
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
        fast = ingest._jsonl_record(orjson.loads(line), i, "s", {}, fast=True)
        plain = ingest._jsonl_record(json.loads(line), i, "s", {}, fast=False)
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


# ----------------------------------------------------------------------------- _fast_valid vs jsonschema

_json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_name = st.text(min_size=1, max_size=8)
_tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": _name, "arguments": st.text(max_size=10) | st.dictionaries(_name, _json, max_size=2)})},
    optional={"id": st.text(max_size=6), "type": st.just("function")},
)  # fmt: skip
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={
        "content": st.none() | st.text(max_size=10),
        "tool_calls": st.none() | st.lists(_tool_call, max_size=2),
        "tool_call_id": st.text(max_size=6),
        "name": st.text(max_size=6),
        "error": st.booleans(),
        "extra": _json,  # messages allow other keys
    },
)
_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.text(max_size=6)},
        optional={"description": st.text(max_size=6), "parameters": st.dictionaries(_name, _json, max_size=2)})},
)  # fmt: skip
_record = st.fixed_dictionaries(
    {
        "task_id": st.text(max_size=6) | st.integers(-(2**70), 2**70),
        "reward": st.integers(0, 1) | st.floats(0, 1),  # the documented range (schemas/episode.v1.json)
        "messages": st.lists(_message, min_size=1, max_size=4),
    },
    optional={
        "kind": st.just("episode"),
        "episode_id": _name,
        "domain": st.text(max_size=6),
        "trial": st.integers(0, 2**70),
        "seed": st.none() | st.integers(-(2**70), 2**70),
        "success": st.booleans(),
        "termination_reason": st.text(max_size=6),
        "reference_actions": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=6), "arguments": st.dictionaries(_name, _json, max_size=2)}
            ),
            max_size=2,
        ),
        "tools": st.lists(_tool, max_size=2),
        "info": st.dictionaries(st.text(max_size=5), _json, max_size=3),
    },
)


# anything goes below these keys: nothing to mutate there
_FREE = {"info", "arguments", "parameters", "extra"}
# values one type or one constraint away from what the schema wants somewhere
NEAR_MISSES = [
    -1,
    0,
    1,
    1.0,
    2.5,
    True,
    False,
    "",
    "x",
    "function",
    "episode",
    "user",
    None,
    [],
    {},
    [{}],
    {"f": 1},
]
_TRICKY = st.sampled_from(NEAR_MISSES)


def _paths(v, path=()):
    yield path
    if path and path[-1] in _FREE:
        return
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*path, i))


@st.composite
def _mutated(draw):
    """A valid record with one or two changes where the schema has something to say: a value replaced (by a
    near miss of another type, or any JSON), a key deleted, or a key added."""
    rec = draw(_record)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
        paths = list(_paths(rec))
        path = draw(st.sampled_from([p for p in paths if len(p) <= 1]) | st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        target = rec
        for p in path:
            target = target[p]
        if how == "add" or not path:
            if isinstance(target, dict):
                name = draw(
                    st.sampled_from(["kind", "role", "function", "name", "arguments", "zz"])
                    | st.text(max_size=4)
                )
                target[name] = draw(_TRICKY | _json)
            continue
        parent = rec
        for p in path[:-1]:
            parent = parent[p]
        if how == "replace":
            parent[path[-1]] = draw(_TRICKY | _json)
        else:
            del parent[path[-1]]
    return rec


_FAST_VALID_SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@_FAST_VALID_SETTINGS
@given(_record)
def test_fast_valid_accepts_generated_valid_records(rec):
    assert _validator("episode.v1.json").is_valid(rec)
    assert ingest._fast_valid(rec)


@_FAST_VALID_SETTINGS
@given(_mutated())
def test_fast_valid_implies_jsonschema_valid(rec):
    if ingest._fast_valid(copy.deepcopy(rec)):
        assert _validator("episode.v1.json").is_valid(rec), rec


def _full_record() -> dict:
    rec = episode(
        "full", kind="episode", domain="shop", trial=2, seed=7, success=True, termination_reason="done"
    )
    rec["reference_actions"] = [{"name": "get_order", "arguments": {"order_id": "#12"}}]
    rec["tools"] = [
        {"type": "function", "function": {"name": "get_order", "description": "d", "parameters": {}}}
    ]
    rec["info"] = {"env": "shop"}
    rec["messages"][1].update(name="customer")
    rec["messages"][3].update(error=False)
    rec["messages"].append({"role": "assistant", "content": "done", "tool_calls": None})
    rec["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": {}}}],
        }
    )
    return rec


def test_fast_valid_implies_jsonschema_valid_for_every_single_change():
    """Exhaustively: every value of a record using every schema key, replaced by each near miss, deleted, or
    given an extra key; whenever _fast_valid says valid, jsonschema agrees."""
    validator = _validator("episode.v1.json")
    base = _full_record()
    assert ingest._fast_valid(base) and validator.is_valid(base)
    values = NEAR_MISSES
    checked = declined = 0
    for path in _paths(base):
        changes = [("add", k) for k in ("kind", "role", "name", "zz")] + [("set", v) for v in values]
        changes += [("del", None)] if path else []
        for how, v in changes:
            rec = copy.deepcopy(base)
            target = rec
            for p in path[:-1] if how != "add" else path:
                target = target[p]
            if how == "add":
                if not isinstance(target, dict) or v in target:
                    continue
                target[v] = 1
            elif how == "set" and path:
                target[path[-1]] = copy.deepcopy(v)
            elif how == "del":
                del target[path[-1]]
            else:
                continue
            checked += 1
            if ingest._fast_valid(rec):
                assert validator.is_valid(rec), (path, how, v)
            elif validator.is_valid(rec):
                declined += 1  # allowed (jsonschema decides), but should stay rare
    assert checked > 500
    assert declined < checked // 5


@pytest.mark.parametrize(
    "change",
    [
        # jsonschema takes 1.0 as an integer; the fast check leaves that to it
        lambda r: r.update(trial=1.0),
        lambda r: r.update(trial=True),
        lambda r: r.update(reward=True),
        lambda r: r.update(task_id=True),
        lambda r: r.update(kind="episodes"),
        lambda r: r.update(episode_id=""),
        lambda r: r.update(extra=1),
        lambda r: r.update(messages=[]),
        lambda r: r["messages"][0].update(role=["user"]),  # unhashable
        lambda r: r["messages"][2]["tool_calls"][0]["function"].update(name=""),
        lambda r: r["messages"][2]["tool_calls"][0]["function"].pop("arguments"),
        lambda r: r["messages"][2]["tool_calls"][0].update(type={"function": 1}),
    ],
)
def test_fast_valid_declines_the_tricky_cases(change):
    rec = episode("x")
    assert ingest._fast_valid(rec)
    change(rec)
    assert not ingest._fast_valid(rec)
