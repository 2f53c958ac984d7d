"""The episode check compiled from schemas/episode.v1.json: it proves the records a JSONL file usually holds
valid, and whenever it says valid, jsonschema agrees (it may decline a valid record: jsonschema then decides).
The compiler refuses what it cannot check, so a schema change can never be half-checked."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_testing import episode

from trace_cli.config.schemas import _validator, load_schema
from trace_cli.formats.jsonl import episode_check
from trace_cli.formats.schema_check import compile_check


def test_every_shipped_record_schema_compiles():
    for name in ("episode.v1.json", "capabilities.v1.json", "diagnosis.v1.json", "environment.v1.json"):
        try:
            compile_check(load_schema(name), name)
        except ValueError as e:  # a keyword it does not know: refused by name, never skipped
            assert "does not compile it" in str(e) and name in str(e)


@pytest.mark.parametrize(
    "schema, why",
    [
        ({"type": "string", "pattern": "^a"}, "keyword 'pattern'"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties"),
        ({"$ref": "other.json"}, "only #/$defs/NAME"),
        ({"$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}, "recursive $ref"),
        ({"enum": [1.5]}, "enum"),
        ({"type": "decimal"}, "type"),
    ],
)
def test_what_it_cannot_check_is_refused(schema, why):
    with pytest.raises(ValueError, match="does not compile it") as e:
        compile_check(schema, "t.json")
    assert why in str(e.value)


def test_it_agrees_with_jsonschema_where_types_are_subtle():
    from jsonschema import Draft202012Validator

    schema = {
        "type": "object",
        "properties": {
            "e": {"enum": [True, 2, "x", None]},
            "n": {"minimum": 0, "maximum": 1},
            "s": {"minLength": 2},
            "a": {"type": ["array", "null"], "items": {"type": "integer"}, "minItems": 1},
        },
    }
    check, validator = compile_check(schema), Draft202012Validator(schema)
    for doc in [
        {"e": True}, {"e": 1}, {"e": 2}, {"e": 2.0}, {"e": False}, {"e": 0}, {"e": None}, {"e": [2]}, {"e": "x"},
        {"n": 0.5}, {"n": 2}, {"n": float("nan")}, {"n": True}, {"n": "9"}, {"s": "ab"}, {"s": "a"}, {"s": 5},
        {"a": None}, {"a": []}, {"a": [1, 2]}, {"a": [1.0]}, {"a": [True]}, {"a": "xy"}, [], "doc",
    ]:  # fmt: skip
        if check(doc):
            assert validator.is_valid(doc), doc
    assert check({"e": True, "n": 1, "s": "ab", "a": [3]}) and not check({"e": 1}) and not check({"n": 2})


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
    rec = copy.deepcopy(
        draw(_record)
    )  # mutated below: never the strategy's own objects (shared between draws)
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
                target[name] = copy.deepcopy(draw(_TRICKY | _json))
            continue
        parent = rec
        for p in path[:-1]:
            parent = parent[p]
        if how == "replace":
            parent[path[-1]] = copy.deepcopy(draw(_TRICKY | _json))
        else:
            del parent[path[-1]]
    return rec


_FAST_VALID_SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@_FAST_VALID_SETTINGS
@given(_record)
def test_fast_valid_accepts_generated_valid_records(rec):
    assert _validator("episode.v1.json").is_valid(rec)
    assert episode_check()(rec)


@_FAST_VALID_SETTINGS
@given(_mutated())
def test_fast_valid_implies_jsonschema_valid(rec):
    if episode_check()(copy.deepcopy(rec)):
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
    given an extra key; whenever the compiled check says valid, jsonschema agrees."""
    validator = _validator("episode.v1.json")
    base = _full_record()
    assert episode_check()(base) and validator.is_valid(base)
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
            if episode_check()(rec):
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
    assert episode_check()(rec)
    change(rec)
    assert not episode_check()(rec)
