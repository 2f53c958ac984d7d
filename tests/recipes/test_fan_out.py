"""Recipe steps that fan out (one artifact per capability): list outputs and their substitution, NAME-KEY names,
validation of list references before anything runs, `trace status` rows per artifact, skipping per artifact,
failures; and the TRACE loop in one recipe: one environment per capability a diagnosis selected, one GRPO
adapter per environment (tiny model), composed."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest
import tinymodel
import yaml
from grpo_helpers import grpo_config, set_env
from trace_testing import episode, make_diagnosis, run_cli, snapshot, write_jsonl

from trace_cli.errors import CheckFailed
from trace_cli.recipes import load_recipe
from trace_cli.recipes.runner import _substitute
from trace_cli.stages import STAGES
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Store
from trace_cli.store.rollouts import read_episodes

# ---------------------------------------------------------------------------------------------- test stages
# `tally`: rollouts -> an eval artifact with its episode count; a list of rollouts fans out (key: the rollouts'
# name); a member with more than `max_episodes` episodes fails its check. `gather`: a list of tallies -> one.

ROLLOUTS = {"type": "string", "minLength": 1}
TALLY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["rollouts"],
    "properties": {
        "rollouts": {"oneOf": [ROLLOUTS, {"type": "array", "items": ROLLOUTS, "minItems": 1}]},
        "max_episodes": {"type": "integer", "default": 100},
    },
}
GATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["reports"],
    "properties": {"reports": {"type": "array", "items": ROLLOUTS, "minItems": 1}},
}


def _tally_prepare(config, store):
    cfg = checked_config("tally", config)
    art = store.resolve(cfg["rollouts"], kind="rollouts")
    inputs = [art.as_input("rollouts")]
    return Prepared("tally", cfg, cfg, inputs, {"report": "eval"}, extra={"art": art}).finalize()


def _tally_run(prepared, store, *, name=None, overrides=None, replace=False):
    n = len(read_episodes(prepared.extra["art"].path))
    if n > prepared.config["max_episodes"]:
        raise CheckFailed(f"{n} episodes, more than {prepared.config['max_episodes']}")
    with prepared.writer(store, "eval", name=name, overrides=overrides, replace=replace) as w:
        w.summary.update(episodes=n)
    return {"report": w.artifact}


def _tally_fan_out(config, store):
    return [
        (store.names_of("rollouts", store.resolve(r).id)[0], {**config, "rollouts": r})
        for r in config["rollouts"]
    ]


def _gather_prepare(config, store):
    cfg = checked_config("gather", config)
    arts = [store.resolve(r, kind="eval") for r in cfg["reports"]]
    inputs = [a.as_input(f"report:{i}") for i, a in enumerate(arts)]
    return Prepared("gather", cfg, cfg, inputs, {"report": "eval"}, extra={"arts": arts}).finalize()


def _gather_run(prepared, store, *, name=None, overrides=None, replace=False):
    with prepared.writer(store, "eval", name=name, overrides=overrides, replace=replace) as w:
        w.summary.update(episodes=sum(a.summary["episodes"] for a in prepared.extra["arts"]))
    return {"report": w.artifact}


def _stage(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(f"fan_out_test_{name}")
    mod.__dict__.update(NAME=name, OUTPUTS={"report": "eval"}, **attrs)
    return mod


@pytest.fixture(autouse=True)
def _test_stages(monkeypatch):
    tally = _stage(
        "tally",
        CONFIG_SCHEMA=TALLY_SCHEMA,
        prepare=_tally_prepare,
        run=_tally_run,
        fans_out=lambda config: isinstance(config.get("rollouts"), list),
        fan_out=_tally_fan_out,
        FAN_OUT_FAILURE="had too many episodes",
    )
    gather = _stage("gather", CONFIG_SCHEMA=GATHER_SCHEMA, prepare=_gather_prepare, run=_gather_run)
    for mod in (tally, gather):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        monkeypatch.setitem(STAGES, mod.NAME, mod.__name__)


def write_recipe(path, steps):
    path.write_text(yaml.safe_dump({"kind": "recipe", "version": 1, "steps": steps}, sort_keys=False))
    return path


STEPS = [
    {"id": "a", "uses": "ingest", "name": "ra", "with": {"format": "jsonl", "path": "a.jsonl"}},
    {"id": "b", "uses": "ingest", "name": "rb", "with": {"format": "jsonl", "path": "b.jsonl"}},
    {
        "id": "tally",
        "uses": "tally",
        "name": "t",
        "with": {"rollouts": ["${steps.a.outputs.rollouts}", "${steps.b.outputs.rollouts}"]},
    },
    {"id": "gather", "uses": "gather", "name": "all", "with": {"reports": "${steps.tally.outputs.report}"}},
]


@pytest.fixture
def recipe(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [episode("a1"), episode("a2")])
    write_jsonl(tmp_path / "b.jsonl", [episode("b1"), episode("b2"), episode("b3")])
    return write_recipe(tmp_path / "recipe.yaml", STEPS)


def run_json(recipe, store, *args, code=0):
    r = run_cli("run", recipe, "--json", "--store", store, *args)
    assert r.exit_code == code, r.output
    return ({s["step"]: s["status"] for s in json.loads(r.stdout)["steps"]} if code == 0 else None), r


# ---------------------------------------------------------------------------------------------- unit tests


def test_substitute_a_whole_reference_to_a_list_gives_the_list():
    outputs = {
        "envs": {"environment": ["store://environment/x", "store://environment/y"]},
        "m": {"model": "u"},
    }
    got = _substitute(
        {
            "env": "${steps.envs.outputs.environment}",
            "model": "${ steps.m.outputs.model }",
            "tag": "m=${steps.m.outputs.model}!",
            "n": [1, "${steps.m.outputs.model}"],
        },
        outputs,
    )
    assert got == {
        "env": ["store://environment/x", "store://environment/y"],
        "model": "u",
        "tag": "m=u!",
        "n": [1, "u"],
    }


def test_which_steps_fan_out_is_known_at_load_and_list_references_are_validated(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", STEPS))
    assert {s.id: s.fans_out for s in recipe.steps} == {
        "a": False,
        "b": False,
        "tally": True,
        "gather": False,
    }
    bad = json.loads(json.dumps(STEPS))
    bad.append({"id": "again", "uses": "tally", "with": {"rollouts": "${steps.tally.outputs.report}"}})
    bad.append({"id": "text", "uses": "tally", "with": {"rollouts": "x-${steps.tally.outputs.report}"}})
    bad[3]["with"]["reports"] = "${steps.a.outputs.rollouts}"  # one URI where a list is expected
    r = run_cli("validate", write_recipe(tmp_path / "bad.yaml", bad))
    assert r.exit_code == 2
    assert "steps[3].with.reports: '${steps.a.outputs.rollouts}' is not of type 'array'" in r.stderr
    assert "steps[5].with.rollouts: ${steps.tally.outputs.report} is a list (step 'tally'" in r.stderr
    # a list is fine where the stage takes one (`again` fans out in turn), not inside a longer string
    assert "steps[4]" not in r.stderr
    assert run_cli("validate", tmp_path / "r.yaml").exit_code == 0


def test_real_stages_take_lists_where_their_schemas_do(tmp_path):
    """synthesize without a capability and GRPO on a list of environments fan out; compose takes the list
    of adapters; an eval of one `model` cannot take it."""
    steps = [
        {
            "id": "envs",
            "uses": "synthesize",
            "with": {"diagnosis": "store://diagnosis/d", "model": "policy:random"},
        },
        {
            "id": "train",
            "uses": "train",
            "with": {"method": "grpo", "env": "${steps.envs.outputs.environment}", "model": "m"},
        },
        {
            "id": "router",
            "uses": "compose",
            "with": {"method": "router", "adapters": "${steps.train.outputs.adapter}"},
        },
        {"id": "one", "uses": "synthesize", "with": {"diagnosis": "d", "capability": "c", "model": "m"}},
    ]
    recipe = load_recipe(write_recipe(tmp_path / "ok.yaml", steps))
    assert [s.fans_out for s in recipe.steps] == [True, True, False, False]
    steps.append(
        {"id": "ev", "uses": "eval", "with": {"model": "${steps.train.outputs.adapter}", "env": "shop"}}
    )
    steps.append(
        {"id": "sft", "uses": "train", "with": {"method": "sft", "env": ["shop", "shop"], "model": "m"}}
    )
    r = run_cli("run", write_recipe(tmp_path / "bad.yaml", steps), "--store", tmp_path / "store")
    assert r.exit_code == 2 and "2 validation errors" in r.stderr
    assert "steps[4].with.model: ['${steps.train.outputs.adapter}'] is not of type 'string'" in r.stderr
    assert "steps[5].with.env: ['shop', 'shop'] is not of type 'string'" in r.stderr  # sft: one environment
    assert not (tmp_path / "store").exists() or snapshot(tmp_path / "store") == []


# ---------------------------------------------------------------------------------------------- runs


def test_a_fanned_out_step_runs_names_and_skips_each_artifact(recipe, store):
    status, r = run_json(recipe, store)
    assert status == {"a": "ran", "b": "ran", "tally[ra]": "ran", "tally[rb]": "ran", "gather": "ran"}
    assert "[tally[ra]] done in" in r.stderr
    st = Store(store)
    assert (
        st.resolve("eval/t-ra").summary["episodes"] == 2 and st.resolve("eval/t-rb").summary["episodes"] == 3
    )
    gathered = st.resolve("eval/all")
    assert gathered.summary["episodes"] == 5
    assert [i["id"] for i in gathered.manifest["inputs"]] == [
        st.resolve("eval/t-ra").id,
        st.resolve("eval/t-rb").id,
    ]
    assert gathered.config["reports"] == [st.resolve("eval/t-ra").uri, st.resolve("eval/t-rb").uri]
    st_ = run_cli("status", recipe, "--json", "--store", store)
    assert {s["step"]: s["status"] for s in json.loads(st_.stdout)} == dict.fromkeys(status, "up to date")
    status, r = run_json(recipe, store)
    assert set(status.values()) == {"skipped"} and r.stderr.count("up to date, skipped") == 5
    # a changed input re-runs that artifact (and what gathers it), not its sibling
    write_jsonl(recipe.parent / "b.jsonl", [episode("b1")])
    rows = json.loads(run_cli("status", recipe, "--json", "--store", store).stdout)
    assert {s["step"]: s["status"] for s in rows} == {
        "a": "up to date",
        "b": "would run",
        "tally": "pending",
        "gather": "pending",
    }
    status, _ = run_json(recipe, store)
    assert status == {"a": "skipped", "b": "ran", "tally[ra]": "skipped", "tally[rb]": "ran", "gather": "ran"}
    assert Store(store).resolve("eval/all").summary["episodes"] == 3


def test_from_resolves_every_artifact_of_a_fanned_out_step(recipe, store):
    run_json(recipe, store)
    status, r = run_json(recipe, store, "--from", "gather", "--force")
    assert status == {
        "a": "resolved",
        "b": "resolved",
        "tally[ra]": "resolved",
        "tally[rb]": "resolved",
        "gather": "ran",
    }
    assert "[tally[rb]] not selected; using store://eval/" in r.stderr


def test_failed_members_are_reported_and_the_others_kept(recipe, store):
    steps = json.loads(json.dumps(STEPS))
    steps[2]["with"]["max_episodes"] = 2
    _, r = run_json(write_recipe(recipe, steps), store, code=1)
    assert "[tally[rb]] failed: 3 episodes, more than 2" in r.stderr
    assert "step 'tally' (tally): 1 of 2 capabilities had too many episodes: rb" in r.stderr
    assert Store(store).resolve("eval/t-ra").summary["episodes"] == 2
    assert [n for k, n, _ in Store(store).names() if k == "eval"] == ["t-ra"]


# ---------------------------------------------------------------------------------------------- the loop


def test_one_environment_and_adapter_per_capability_then_composed(tmp_path_factory, tmp_path):
    """The TRACE loop's fan-out in one recipe: synthesize without a capability makes one environment per
    capability the diagnosis selected; GRPO on their list one adapter each (tiny model, one step); compose
    takes the adapters' list. Re-running skips every artifact."""
    set_env()
    tiny = tinymodel.tiny(tmp_path_factory)
    caps = ["precondition_verification", "multi_step_completion"]
    st = Store(tmp_path / "store")
    diag = make_diagnosis(st, caps)
    grpo = grpo_config(tiny.hf, env="${steps.envs.outputs.environment}", max_steps=1, require_learning=False)
    grpo.update(num_generations=2, per_device_batch_size=2, max_new_tokens=8)
    steps = [
        {
            "id": "envs",
            "uses": "synthesize",
            "name": "env",
            "with": {
                "diagnosis": diag,
                "model": "policy:demonstration?rate=0.5",
                "calibration": {"seeds": 20, "rollouts": 4},
            },
        },
        {"id": "train", "uses": "train", "name": "adapter", "with": grpo},
        {
            "id": "router",
            "uses": "compose",
            "name": "router",
            "with": {"method": "router", "adapters": "${steps.train.outputs.adapter}"},
        },
    ]
    recipe = write_recipe(tmp_path / "loop.yaml", steps)
    rows = json.loads(run_cli("status", recipe, "--json", "--store", st.root).stdout)
    assert [(s["step"], s["status"]) for s in rows] == [
        ("envs[precondition_verification]", "would run"),
        ("envs[multi_step_completion]", "would run"),
        ("train", "pending"),
        ("router", "pending"),
    ]
    status, _ = run_json(recipe, st.root)
    assert status == {
        **{f"envs[{c}]": "ran" for c in caps},
        **{f"train[{c}]": "ran" for c in caps},
        "router": "ran",
    }
    for c in caps:
        env = st.resolve(f"environment/env-{c}")
        adapter = st.resolve(f"adapter/adapter-{c}")
        assert env.summary["capability"] == c and adapter.summary["capability"] == c
        assert adapter.summary["steps"] == 1
        assert adapter.config["env"] == env.uri and adapter.manifest["inputs"][1]["id"] == env.id
    doc = yaml.safe_load((st.resolve("composition/router").path / "composition.yaml").read_text())
    assert [e["name"] for e in doc["experts"]] == caps
    rows = json.loads(run_cli("status", recipe, "--json", "--store", st.root).stdout)
    assert {s["step"]: s["status"] for s in rows} == dict.fromkeys(status, "up to date")
    status, _ = run_json(recipe, st.root)
    assert set(status.values()) == {"skipped"}
