"""`trace validate`: every error at once with file and YAML path; exit 2 on any error, 0 when valid."""

from __future__ import annotations

import json

import pytest
import yaml
from trace_testing import REPO, episode, run_cli, run_trace, write_jsonl

from trace_cli.config import apply_overrides, load_document, parse_override
from trace_cli.config.schemas import format_path, load_schema
from trace_cli.errors import UsageError


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _errors(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.startswith("  ")]


def test_recipe_with_three_errors_in_one_step(tmp_path):
    f = _write(
        tmp_path / "r.yaml",
        {
            "kind": "recipe",
            "steps": [{"id": "ingest", "uses": "ingest", "with": {"format": "tau3", "path": 5, "extra": 1}}],
        },
    )
    r = run_trace("validate", f)
    assert r.returncode == 2
    assert f"{f}: 3 validation errors:" in r.stderr
    assert sorted(_errors(r.stderr)) == [
        "steps[0].with.extra: unknown key (allowed: format, kind, on_error, path, source)",
        "steps[0].with.format: 'tau3' is not one of ['tau2', 'jsonl']",
        "steps[0].with.path: 5 is not of type 'string'",
    ]
    assert "error: 1 of 1 file(s) invalid" in r.stderr


def test_schema_and_step_errors_are_reported_together(tmp_path):
    f = _write(
        tmp_path / "r.yaml",
        {
            "kind": "recipe",
            "nme": "typo",
            "colour": "red",
            "steps": [
                {"id": "a", "uses": "ingest", "with": {"format": "tau2"}},
                {"id": "b", "use": "ingest"},
                {
                    "id": "c",
                    "uses": "ingest",
                    "with": {"format": "jsonl", "path": "${steps.zz.outputs.rollouts}"},
                },
                {"id": "a", "uses": "ingest", "with": {"format": "jsonl", "path": "x", "on_error": "ignore"}},
            ],
        },
    )
    r = run_cli("validate", f)
    assert r.exit_code == 2
    errs = _errors(r.stderr)
    assert sorted(errs) == sorted(
        [
            "nme: unknown key; did you mean 'name'? (allowed: description, kind, name, steps, version)",
            "colour: unknown key (allowed: description, kind, name, steps, version)",
            "steps[1].use: unknown key; did you mean 'uses'? (allowed: id, name, uses, with)",
            "steps[1]: 'uses' is a required property",
            "steps[0].with: 'path' is a required property",
            "steps[3].id: duplicate step id 'a' (also steps[0])",
            "steps[3].with.on_error: 'ignore' is not one of ['fail', 'skip']",
            "steps[2].with.path: dangling reference ${steps.zz.outputs.rollouts}: no step 'zz'",
        ]
    )
    assert f"{f}: {len(errs)} validation errors:" in r.stderr


def test_unknown_keys_everywhere(tmp_path):
    f = _write(
        tmp_path / "cfg.yaml",
        {"kind": "ingest", "format": "jsonl", "path": "x.jsonl", "colour": 1, "paht": "y"},
    )
    r = run_cli("validate", f)
    assert r.exit_code == 2
    assert sorted(_errors(r.stderr)) == [
        "colour: unknown key (allowed: format, kind, on_error, path, source)",
        "paht: unknown key; did you mean 'path'? (allowed: format, kind, on_error, path, source)",
    ]


def test_valid_files_exit_0(tmp_path, tau2_dir):
    cfg = _write(
        tmp_path / "ingest.yaml",
        {"kind": "ingest", "format": "tau2", "path": "results.json", "on_error": "skip"},
    )
    cfg_json = tmp_path / "ingest.json"
    cfg_json.write_text(json.dumps({"kind": "ingest", "format": "jsonl", "path": "e.jsonl"}))
    eps = write_jsonl(tmp_path / "eps.jsonl", [episode("a"), episode("b", reward=0.0)])
    r = run_trace("validate", REPO / "recipes" / "demo.yaml", cfg, cfg_json, eps)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{REPO / 'recipes' / 'demo.yaml'}: ok (recipe.v1.json)",
        f"{cfg}: ok (config/ingest.v1.json)",
        f"{cfg_json}: ok (config/ingest.v1.json)",
        f"{eps}: ok (episode.v1.json)",
    ]


def test_manifest_is_validated_by_file_name(tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("a")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    (manifest,) = list(store.rglob("manifest.yaml"))
    assert run_cli("validate", manifest).exit_code == 0
    doc = yaml.safe_load(manifest.read_text())
    doc["files"][0]["sha256"] = "nothex"
    doc["surprise"] = True
    bad = tmp_path / "manifest.yaml"
    _write(bad, doc)
    r = run_cli("validate", bad)
    assert r.exit_code == 2
    assert "files[0].sha256: 'nothex' does not match '^[0-9a-f]{64}$'" in r.stderr
    assert "surprise: unknown key" in r.stderr


def test_jsonl_is_validated_line_by_line(tmp_path):
    good = episode("a")
    bad = episode("b", reward="x", task_id=1.5)
    bad["messages"][0]["role"] = "bot"
    f = write_jsonl(tmp_path / "e.jsonl", [good, "", bad, "{trunc", episode("c", extra_key=1)])
    r = run_cli("validate", f)
    assert r.exit_code == 2
    assert _errors(r.stderr) == [
        "line 3: messages[0].role: 'bot' is not one of ['system', 'developer', 'user', 'assistant', 'tool']",
        "line 3: reward: 'x' is not of type 'number'",
        "line 3: task_id: 1.5 is not of type 'string', 'integer'",
        "line 4: invalid JSON: Expecting property name enclosed in double quotes",
        "line 5: extra_key: unknown key (allowed: domain, episode_id, info, kind, messages, reference_actions, "
        "reward, seed, success, task_id, termination_reason, tools, trial)",
    ]
    assert f"{f}: 5 validation errors:" in r.stderr


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("broken.yaml", "kind: ingest\npath: [x\n", "broken.yaml:3:1: invalid YAML"),
        ("broken.json", '{"kind": "ingest",', "broken.json:1:19: invalid JSON"),
        ("widget.yaml", "kind: widget\n", "unknown or missing `kind` ('widget'); expected one of:"),
        ("nokind.yaml", "format: jsonl\n", "unknown or missing `kind` (None)"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping with a `kind` key at the top"),
        ("empty.yaml", "", "the file is empty"),
        ("empty.jsonl", "", "the file is empty"),
        ("binary.yaml", b"\xff\xfe\x00\x01", "not a UTF-8 text file"),
        ("binary.jsonl", b"\xff\xfe\x00\x01", "not a UTF-8 text file"),
        ("recipe_no_steps.yaml", "kind: recipe\nsteps: []\n", "steps: [] should be non-empty"),
    ],
)
def test_bad_files(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_bytes(content) if isinstance(content, bytes) else f.write_text(content)
    r = run_cli("validate", f)
    assert r.exit_code == 2, r.output
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_missing_file_directory_and_mixed(tmp_path):
    good = _write(tmp_path / "ok.yaml", {"kind": "ingest", "format": "jsonl", "path": "x"})
    r = run_cli("validate", good, tmp_path / "nope.yaml", tmp_path)
    assert r.exit_code == 2
    assert f"{good}: ok" in r.stdout
    assert "nope.yaml: no such file" in r.stderr and "is a directory" in r.stderr
    assert "error: 2 of 3 file(s) invalid" in r.stderr
    assert run_cli("validate").exit_code == 2  # FILES is required


def test_override_parsing():
    assert parse_override("steps.train.with.lora.rank=16") == (["steps", "train", "with", "lora", "rank"], 16)
    assert parse_override("a[1].b=true") == (["a", 1, "b"], True)
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a.b=1e-5") == (["a", "b"], 1e-5)  # YAML 1.1 alone would give the string '1e-5'
    assert parse_override("a.b=-2E+3") == (["a", "b"], -2000.0)
    assert parse_override("a.b=1e5x") == (["a", "b"], "1e5x")
    assert parse_override("a.b=") == (["a", "b"], "")
    assert parse_override("a.b=x=y") == (["a", "b"], "x=y")
    doc = {"a": {"b": [1, 2]}, "keep": 1}
    out, applied = apply_overrides(doc, ["a.b[1]=5", "a.c.d=new"])
    assert out == {"a": {"b": [1, 5], "c": {"d": "new"}}, "keep": 1}
    assert doc == {"a": {"b": [1, 2]}, "keep": 1}  # the input is not modified
    assert applied == [{"key": "a.b[1]", "old": 2, "new": 5}, {"key": "a.c.d", "old": None, "new": "new"}]
    for bad in ["nokey", "a..b=1", "a.b[x]=1", "=1"]:
        with pytest.raises(UsageError):
            apply_overrides(doc, [bad])
    with pytest.raises(UsageError, match="index"):
        apply_overrides(doc, ["a.b[7]=1"])
    with pytest.raises(UsageError, match="not inside a mapping"):
        apply_overrides(doc, ["keep.x=1"])


def test_schemas_are_versioned_and_strict():
    assert format_path(["steps", 1, "with", "lora", "rank"]) == "steps[1].with.lora.rank"
    assert format_path([]) == "<root>"
    for name in ("recipe.v1.json", "manifest.v1.json", "episode.v1.json", "config/ingest.v1.json"):
        s = load_schema(name)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["$id"].endswith(name)
        assert s["additionalProperties"] is False


def test_exponent_floats_in_yaml_files(tmp_path):
    f = tmp_path / "train.yaml"
    f.write_text("lr: 1e-5\nbeta: 0\nname: 1e5x\n")
    assert load_document(f) == {"lr": 1e-5, "beta": 0, "name": "1e5x"}
