"""Read-only configs: a stage runs with a StageConfig that reads like the dict it was and refuses every change."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import yaml
from trace_testing import episode, write_jsonl

from trace_cli.config.frozen import FrozenDict, FrozenList, StageConfig, freeze, freeze_stage_config, thaw
from trace_cli.config.schemas import validate

DOC = {"a": 1, "moe": {"data": [{"expert": "x", "rollouts": "r"}], "steps": 2}, "band": [0.2, 0.6]}

MUTATIONS = {
    "setitem": lambda c: c.__setitem__("a", 2),
    "delitem": lambda c: c.__delitem__("a"),
    "pop": lambda c: c.pop("a"),
    "popitem": lambda c: c.popitem(),
    "setdefault": lambda c: c.setdefault("new", 1),
    "update": lambda c: c.update(a=3),
    "clear": lambda c: c.clear(),
    "ior": lambda c: c.__ior__({"a": 4}),
    "nested setitem": lambda c: c["moe"].__setitem__("steps", 3),
    "list append": lambda c: c["band"].append(1.0),
    "list setitem": lambda c: c["band"].__setitem__(0, 0.0),
    "list sort": lambda c: c["band"].sort(),
    "list iadd": lambda c: c["band"].__iadd__([1]),
    "deep": lambda c: c["moe"]["data"][0].__setitem__("expert", "y"),
}


@pytest.mark.parametrize("mutate", list(MUTATIONS.values()), ids=list(MUTATIONS))
def test_every_mutation_raises(mutate):
    cfg = freeze_stage_config("compose", DOC)
    with pytest.raises(TypeError, match="read-only"):
        mutate(cfg)
    assert cfg == DOC


def test_reads_like_the_dict_it_was():
    cfg = freeze_stage_config("compose", DOC)
    assert isinstance(cfg, StageConfig) and cfg.stage == "compose"
    assert isinstance(cfg["moe"], FrozenDict) and isinstance(cfg["band"], FrozenList)
    assert isinstance(cfg, dict) and isinstance(cfg["band"], list)
    assert cfg == DOC and cfg["moe"]["steps"] == 2 and cfg.get("nope", 5) == 5
    assert json.loads(json.dumps(cfg)) == DOC
    assert yaml.safe_load(yaml.safe_dump(cfg, sort_keys=False)) == DOC
    validate(cfg, {"type": "object", "properties": {"band": {"type": "array"}, "moe": {"type": "object"}}})
    back = pickle.loads(pickle.dumps(cfg))
    assert isinstance(back, StageConfig) and back.stage == "compose" and back == DOC
    with pytest.raises(TypeError):
        back["band"].append(1)


def test_copies_and_thaw_are_yours_to_change():
    cfg = freeze(DOC)
    for mine in (thaw(cfg), copy.deepcopy(cfg)):
        assert type(mine) is dict and type(mine["band"]) is list and type(mine["moe"]["data"][0]) is dict
        mine["moe"]["data"][0]["expert"] = "y"
        mine["band"].append(1.0)
    assert cfg == DOC
    shallow = copy.copy(cfg)
    shallow["a"] = 2
    assert cfg["a"] == 1


def test_a_stage_runs_with_a_frozen_config(tmp_path, monkeypatch):
    """execute: prepare gets a read-only copy of what it was given; run gets the resolved StageConfig, which
    the manifest records as plain YAML."""
    import trace_cli.stages.ingest as ingest
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    seen = {}
    prepare, run = ingest.prepare, ingest.run

    def spy_prepare(config, store):
        seen["given"] = config
        return prepare(config, store)

    def spy_run(prepared, store, **kw):
        seen["run"] = prepared.config
        with pytest.raises(TypeError):
            prepared.config["on_error"] = "skip"
        return run(prepared, store, **kw)

    monkeypatch.setattr(ingest, "prepare", spy_prepare)
    monkeypatch.setattr(ingest, "run", spy_run)
    given = {"format": "jsonl", "path": str(write_jsonl(tmp_path / "e.jsonl", [episode("e1")]))}
    out = execute("ingest", given, Store(tmp_path / "store"))
    assert isinstance(seen["given"], FrozenDict) and seen["given"] == given
    assert isinstance(seen["run"], StageConfig) and seen["run"].stage == "ingest"
    assert seen["run"]["on_error"] == "fail" and seen["run"]["source"] == "e.jsonl"  # defaults, resolved
    assert given == {"format": "jsonl", "path": given["path"]}  # the caller's dict is untouched
    manifest = yaml.safe_load((out.main.path / "manifest.yaml").read_text())
    assert manifest["config"] == dict(seen["run"])
