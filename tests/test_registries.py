"""One registry per contract, and the registries that describe one thing checked against each other.

A capability is three things at once: its environment template (envs.synthetic.TEMPLATES), its rules detector
(analysts.rules.DETECTORS: without one the default analyst labels it NA and can never select it) and its catalogue
entry (catalog/capabilities.yaml: what the LLM analysts label by). The composition methods are named once
(compose.METHODS); the schemas, the stage, the report and the benchmarks must agree with that list."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

import trace_cli
from trace_cli.analysts.rules import DETECTORS
from trace_cli.compose import METHODS
from trace_cli.envs.synthetic import TEMPLATES

ROOT = Path(trace_cli.__file__).parent.parent


def _catalogue() -> dict[str, dict]:
    doc = yaml.safe_load((ROOT / "trace_cli" / "catalog" / "capabilities.yaml").read_text())
    return {c["name"]: c for c in doc["capabilities"]}


def test_every_template_is_a_capability_with_a_detector_and_a_catalogue_entry():
    catalogue = _catalogue()
    assert set(TEMPLATES) - set(DETECTORS) == set(), "templates without a rules detector"
    assert set(TEMPLATES) - set(catalogue) == set(), "templates without a catalogue entry"


def test_every_catalogue_capability_has_a_detector_and_every_detector_a_capability():
    catalogue = _catalogue()
    assert set(catalogue) - set(DETECTORS) == set(), "catalogue entries the rules analyst cannot label"
    # a detector under another name is an alias of a catalogue capability (the same function), never a stray
    by_function = {DETECTORS[n]: n for n in catalogue}
    strays = [n for n, f in DETECTORS.items() if n not in catalogue and f not in by_function]
    assert not strays, strays


def test_the_composition_methods_are_named_once():
    from trace_cli.report.collect import SE_METHODS
    from trace_cli.stages.compose import METHOD_KEYS

    assert METHOD_KEYS is METHODS
    for schema in ("config/compose.v1.json", "composition.v1.json"):
        doc = json.loads((ROOT / "schemas" / schema).read_text())
        assert tuple(doc["properties"]["method"]["enum"]) == METHODS, schema
    assert set(METHODS) <= set(SE_METHODS)
