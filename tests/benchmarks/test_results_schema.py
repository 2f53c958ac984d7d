"""Every committed result in benchmarks/results/ conforms to its schema (benchmarks/schemas/results_index.json
says which): the files the README and docs quote cannot lose the fields they are quoted from."""

from __future__ import annotations

import fnmatch
import json
import subprocess
from pathlib import Path

import jsonschema

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "benchmarks" / "schemas"
RESULTS = "benchmarks/results/"


def schema_for(rel: str) -> str | None:
    """The schema checking `rel` (relative to benchmarks/results/): the first pattern of the index it matches."""
    index = json.loads((SCHEMAS / "results_index.json").read_text(encoding="utf-8"))
    return next((e["schema"] for e in index["files"] if fnmatch.fnmatch(rel, e["glob"])), None)


def problems_of(rel: str, doc) -> list[str]:
    name = schema_for(rel)
    if name is None:
        return [f"{rel}: no entry in benchmarks/schemas/results_index.json"]
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    v = jsonschema.Draft202012Validator(schema)
    return [
        f"{rel} ({name}): /{'/'.join(map(str, e.absolute_path))}: {e.message[:160]}"
        for e in v.iter_errors(doc)
    ]


def test_every_committed_result_conforms_to_its_schema():
    files = subprocess.run(
        ["git", "ls-files", RESULTS], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    files = [f for f in files if f.endswith(".json")]
    assert len(files) >= 40
    problems = []
    for f in files:
        problems += problems_of(f[len(RESULTS) :], json.loads((REPO / f).read_text(encoding="utf-8")))
    assert problems == [], "\n".join(problems)


def test_the_check_fails_on_a_result_that_lost_what_is_quoted_from_it():
    doc = json.loads((REPO / RESULTS / "sample_efficiency_mixed.json").read_text(encoding="utf-8"))
    assert schema_for("sample_efficiency_mixed.json") == "sample_efficiency.schema.json"
    assert problems_of("sample_efficiency_mixed.json", doc) == []
    del doc["targets"]
    assert problems_of("sample_efficiency_mixed.json", doc)
    demo = json.loads((REPO / RESULTS / "demo.json").read_text(encoding="utf-8"))
    demo["adapters"]["precondition_verification"]["adapter"] = 1.5  # not a pass@1
    assert problems_of("demo.json", demo)
    assert problems_of("new.json", {"rows": []})  # no command, benchmark or commit
    assert schema_for("confirm/v1/lr-trace-0.001.json") == "sample_efficiency.schema.json"
