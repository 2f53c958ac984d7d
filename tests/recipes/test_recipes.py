"""`trace run` / `trace status`: DAG validation before anything runs, caching, --set/--force/--from/--to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trace_testing import REPO, TAU2_FILES, episode, run_cli, run_trace, snapshot, write_jsonl

from trace_cli.stages import STAGES
from trace_cli.store import Store

STEPS = [
    {"id": "a", "uses": "ingest", "name": "rollouts-a", "with": {"format": "jsonl", "path": "a.jsonl"}},
    {"id": "b", "uses": "ingest", "with": {"format": "jsonl", "path": "b.jsonl"}},
    {"id": "count_a", "uses": "count_episodes", "with": {"rollouts": "${steps.a.outputs.rollouts}"}},
    {
        "id": "count_b",
        "uses": "count_episodes",
        "with": {"rollouts": "${steps.b.outputs.rollouts}", "label": "b"},
    },
]


@pytest.fixture(autouse=True)
def _test_stage(monkeypatch):
    monkeypatch.setitem(STAGES, "count_episodes", "fixture_stages")


@pytest.fixture
def recipe(tmp_path):
    """A recipe with two independent chains: a -> count_a and b -> count_b (inputs beside the recipe)."""
    write_jsonl(tmp_path / "a.jsonl", [episode("a1"), episode("a2", reward=0.0)])
    write_jsonl(tmp_path / "b.jsonl", [episode("b1"), episode("b2"), episode("b3", reward=0.5)])
    return write_recipe(tmp_path / "recipe.yaml", STEPS)


def write_recipe(path, steps, **top):
    doc = {"kind": "recipe", "version": 1, "name": "test", **top, "steps": steps}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(recipe, store, *args):
    r = run_cli("run", recipe, "--json", "--store", store, *args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    return {s["step"]: s["status"] for s in out["steps"]}, out, r


def test_second_run_skips_every_step(recipe, store):
    status, out, _ = run(recipe, store)
    assert status == {"a": "ran", "b": "ran", "count_a": "ran", "count_b": "ran"}
    arts = Store(store).list()
    assert sorted(a.kind for a in arts) == ["eval", "eval", "rollouts", "rollouts"]
    report = Store(store).resolve(out["steps"][2]["id"], kind="eval")
    assert report.summary == {"episodes": 2, "at_least_min_reward": 1, "label": "all"}
    # the downstream artifact records its upstream as lineage
    assert report.manifest["inputs"][0]["id"] == out["steps"][0]["id"]
    status, _, r = run(recipe, store)
    assert set(status.values()) == {"skipped"}
    assert r.stderr.count("up to date, skipped") == 4
    assert len(Store(store).list()) == 4
    # `trace status` agrees
    st = run_cli("status", recipe, "--json", "--store", store)
    assert st.exit_code == 0, st.output
    assert {s["step"]: s["status"] for s in json.loads(st.stdout)} == dict.fromkeys(status, "up to date")


def test_set_reruns_that_step_and_its_dependents_only(recipe, store):
    run(recipe, store)
    status, out, r = run(recipe, store, "--set", "steps.a.with.source=renamed")
    assert status == {"a": "ran", "b": "skipped", "count_a": "ran", "count_b": "skipped"}
    assert "override steps.a.with.source: None -> 'renamed'" in r.stderr
    assert out["overrides"] == [{"key": "steps.a.with.source", "old": None, "new": "renamed"}]
    st = Store(store)
    a = st.resolve(out["steps"][0]["id"], kind="rollouts")
    assert a.manifest["overrides"] == [{"key": "steps.a.with.source", "old": None, "new": "renamed"}]
    assert a.config["source"] == "renamed"
    count_a = st.resolve(out["steps"][2]["id"], kind="eval")
    assert count_a.manifest["overrides"] == []
    assert count_a.manifest["inputs"][0]["id"] == a.id
    # the name follows the step's newest artifact
    assert st.resolve("rollouts-a").id == a.id
    # several overrides, one on a downstream step only
    status, out, r = run(
        recipe, store, "--set", "steps.count_b.with.min_reward=0.5", "--set", "steps.count_b.with.label=x"
    )
    assert status == {"a": "skipped", "b": "skipped", "count_a": "skipped", "count_b": "ran"}
    assert "override steps.count_b.with.min_reward: None -> 0.5" in r.stderr
    assert "override steps.count_b.with.label: 'b' -> 'x'" in r.stderr
    cb = st.resolve(out["steps"][3]["id"], kind="eval")
    assert cb.summary["at_least_min_reward"] == 3
    assert [o["key"] for o in cb.manifest["overrides"]] == [
        "steps.count_b.with.min_reward",
        "steps.count_b.with.label",
    ]


def test_editing_the_file_reruns_that_step_and_its_dependents_only(recipe, store, tmp_path):
    run(recipe, store)
    steps = json.loads(json.dumps(STEPS))
    steps[1]["with"]["on_error"] = "skip"  # b's config changes -> b and count_b re-run
    write_recipe(recipe, steps)
    st = run_cli("status", recipe, "--json", "--store", store)
    assert {s["step"]: s["status"] for s in json.loads(st.stdout)} == {
        "a": "up to date",
        "b": "would run",
        "count_a": "up to date",
        "count_b": "pending",
    }
    status, _, _ = run(recipe, store)
    assert status == {"a": "skipped", "b": "ran", "count_a": "skipped", "count_b": "ran"}
    # changing an input file's content re-runs its chain too
    write_jsonl(tmp_path / "a.jsonl", [episode("a1"), episode("a2"), episode("a3")])
    status, out, _ = run(recipe, store)
    assert status == {"a": "ran", "b": "skipped", "count_a": "ran", "count_b": "skipped"}
    assert Store(store).resolve(out["steps"][2]["id"]).summary["episodes"] == 3


def test_reordering_steps_reruns_nothing(recipe, store):
    run(recipe, store)
    write_recipe(recipe, list(reversed(STEPS)))
    status, out, _ = run(recipe, store)
    assert set(status.values()) == {"skipped"}
    # dependencies still come first
    order = [s["step"] for s in out["steps"]]
    assert order.index("a") < order.index("count_a") and order.index("b") < order.index("count_b")


def test_force_reruns(recipe, store):
    _, first, _ = run(recipe, store)
    status, out, _ = run(recipe, store, "--force")
    assert set(status.values()) == {"ran"}
    # same inputs and config -> same ids, replaced in place
    assert [s["id"] for s in out["steps"]] == [s["id"] for s in first["steps"]]
    assert len(Store(store).list()) == 4
    assert run_cli("store", "verify", "--store", store).exit_code == 0


def test_from_and_to(recipe, store):
    # --from a step whose upstream was never run is an error before anything runs
    r = run_cli("run", recipe, "--from", "count_a", "--store", store)
    assert r.exit_code == 2
    assert "step 'a' is outside --from/--to but has no up-to-date output" in r.stderr
    assert snapshot(store) == []
    # --to count_a runs count_a and what it depends on, nothing else
    status, _, _ = run(recipe, store, "--to", "count_a")
    assert status == {"a": "ran", "count_a": "ran"}
    assert sorted(a.kind for a in Store(store).list()) == ["eval", "rollouts"]
    # --from count_a resolves a (not selected, up to date) and re-runs count_a with --force
    status, _, r = run(recipe, store, "--from", "count_a", "--force")
    assert status == {"a": "resolved", "count_a": "ran"}
    assert "[a] not selected; using store://rollouts/" in r.stderr
    # --from b runs b and its dependents
    status, _, _ = run(recipe, store, "--from", "b")
    assert status == {"b": "ran", "count_b": "ran"}
    # --from a --to a: just a
    status, _, _ = run(recipe, store, "--from", "a", "--to", "a", "--force")
    assert status == {"a": "ran"}
    r = run_cli("run", recipe, "--from", "nope", "--store", store)
    assert r.exit_code == 2 and "no step with id 'nope'" in r.stderr


def _invalid(recipe_path, store, *needles, args=()):
    before = snapshot(store)
    r = run_cli("run", recipe_path, "--store", store, *args)
    assert r.exit_code == 2, r.output
    for n in needles:
        assert n in r.stderr, r.stderr
    assert snapshot(store) == before
    return r


def _rollouts_from(tmp_path, name: str, refs: dict[int, str]):
    """A copy of STEPS whose steps take their `rollouts` from `refs` ({step index: reference}), written."""
    steps = json.loads(json.dumps(STEPS))
    for i, ref in refs.items():
        steps[i]["with"]["rollouts"] = ref
    return write_recipe(tmp_path / name, steps)


def test_cycle_is_rejected_before_anything_runs(recipe, store, tmp_path):
    cycle = {2: "${steps.count_b.outputs.report}", 3: "${steps.count_a.outputs.report}"}
    _invalid(_rollouts_from(tmp_path, "cycle.yaml", cycle), store, "cycle: count_a -> count_b -> count_a")
    own = _rollouts_from(tmp_path, "self.yaml", {2: "${steps.count_a.outputs.report}"})
    _invalid(own, store, "steps[2].with.rollouts: step 'count_a' refers to its own output")


def test_dangling_reference_and_bad_output_name(recipe, store, tmp_path):
    run(recipe, store, "--to", "a")  # a non-empty store must stay untouched too
    refs = {2: "${steps.nowhere.outputs.rollouts}", 3: "${steps.b.outputs.episodes}"}
    r = _invalid(
        _rollouts_from(tmp_path, "dangling.yaml", refs),
        store,
        "steps[2].with.rollouts: dangling reference ${steps.nowhere.outputs.rollouts}: no step 'nowhere'",
        "steps[3].with.rollouts: step 'b' (ingest) has no output 'episodes'; outputs: rollouts",
    )
    assert "2 validation errors" in r.stderr
    typo = _rollouts_from(tmp_path, "typo.yaml", {2: "${steps.a.output.rollouts}"})
    _invalid(typo, store, "cannot parse reference '${steps.a.output.rollouts}'")


def test_unknown_stage_duplicate_ids_and_bad_config(store, tmp_path):
    steps = json.loads(json.dumps(STEPS))
    steps[1]["uses"] = "teleport"
    _invalid(write_recipe(tmp_path / "unknown.yaml", steps), store, "steps[1].uses: unknown stage 'teleport'")
    steps = json.loads(json.dumps(STEPS))
    steps[1]["id"] = "a"
    _invalid(
        write_recipe(tmp_path / "dup.yaml", steps),
        store,
        "steps[1].id: duplicate step id 'a' (also steps[0])",
    )
    steps = json.loads(json.dumps(STEPS))
    steps[0]["with"] = {"format": "tau3", "path": 5, "extra": 1}
    steps[2]["with"]["min_reward"] = "high"
    _invalid(
        write_recipe(tmp_path / "config.yaml", steps),
        store,
        "steps[0].with.extra: unknown key",
        "steps[0].with.format: 'tau3' is not one of ['tau2', 'jsonl']",
        "steps[0].with.path: 5 is not of type 'string'",
        "steps[2].with.min_reward: 'high' is not of type 'number'",
    )


def test_bad_overrides(recipe, store):
    _invalid(recipe, store, "no step with id 'zz'", args=("--set", "steps.zz.with.path=x"))
    _invalid(
        recipe,
        store,
        "(after --set)",
        "steps[0].with.on_error: 'maybe' is not one of",
        args=("--set", "steps.a.with.on_error=maybe"),
    )
    _invalid(recipe, store, "expected KEY=VALUE", args=("--set", "steps.a.with.source"))
    _invalid(recipe, store, "steps.STEP_ID.with.KEY=VALUE", args=("--set", "name=x"))


def test_missing_input_file_fails_before_writing(recipe, store, tmp_path):
    (tmp_path / "b.jsonl").unlink()
    r = run_cli("run", recipe, "--store", store)
    assert r.exit_code == 2
    assert "step 'b' (ingest)" in r.stderr and "b.jsonl: no such file" in r.stderr


def test_demo_recipe_ingest_steps_run_twice_in_a_subprocess(tau2_dir, tmp_path):
    """`make demo`'s ingest steps, as shipped: real τ² files, paths relative to the recipe file.

    Later issues add heavier steps to the demo; this runs only its `ingest` steps (their paths made absolute).
    """
    shipped = REPO / "recipes" / "demo.yaml"
    assert shipped.read_text().startswith("#") and "trace run recipes/demo.yaml" in shipped.read_text()
    doc = yaml.safe_load(shipped.read_text())
    steps = [s for s in doc["steps"] if s["uses"] == "ingest"]
    assert steps and steps[0] == doc["steps"][0]  # the demo starts with an ingest step
    for s in steps:
        path = (shipped.parent / s["with"]["path"]).resolve()
        assert path.is_file() and path.parent == tau2_dir, path
        s["with"]["path"] = str(path)
    demo = write_recipe(tmp_path / "demo.yaml", steps, description=doc.get("description", ""))
    store = tmp_path / "store"
    r = run_trace("run", demo, "--json", "--store", store)
    assert r.returncode == 0, r.stderr
    assert {s["status"] for s in json.loads(r.stdout)["steps"]} == {"ran"}
    r = run_trace("run", demo, "--json", "--store", store)
    assert r.returncode == 0, r.stderr
    assert {s["status"] for s in json.loads(r.stdout)["steps"]} == {"skipped"}
    expected = {TAU2_FILES[d]: n for d, n in (("retail", 40), ("airline", 20), ("telecom", 20))}
    r = run_trace(
        "store", "sql", "select source, count(*) as n from episodes group by 1", "--json", "--store", store
    )
    got = {x["source"]: x["n"] for x in json.loads(r.stdout)}
    assert got == {Path(s["with"]["path"]).name: expected[Path(s["with"]["path"]).name] for s in steps}
    names = {n for _, n, _ in Store(store).names()}
    assert {s["name"] for s in steps if s.get("name")} <= names


def test_model_source_paths_are_relative_to_the_recipe_but_builtin_names_stay(tmp_path):
    from trace_cli.recipes.model import Step
    from trace_cli.recipes.runner import _resolve_paths

    (tmp_path / "weights").mkdir()
    step = Step(id="m", uses="model", with_={}, name=None, index=0)
    got = _resolve_paths(step, {"source": "weights"}, tmp_path)
    assert got["source"] == str((tmp_path / "weights").resolve())
    got = _resolve_paths(step, {"source": "../elsewhere/dir"}, tmp_path)
    assert got["source"] == str((tmp_path / "../elsewhere/dir").resolve())
    assert (
        _resolve_paths(step, {"source": "smollm2-135m-instruct"}, tmp_path)["source"]
        == "smollm2-135m-instruct"
    )
