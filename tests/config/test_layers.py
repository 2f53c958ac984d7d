"""Config layers: the --config file < flags < --set, nested keys, and what a file must be."""

from __future__ import annotations

import pytest

from trace_cli.config.layers import get_path, layer, present, read_config_file
from trace_cli.errors import InputError, UsageError


def test_flags_over_the_file_and_set_over_both(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: 1\nb: 1\nc: {x: 1, y: 1}\n")
    cfg, applied = layer("eval", file=f, flags={"b": 2, "c.x": 2, "d.z": 2}, overrides=["c.y=3", "b=3"])
    assert cfg == {"a": 1, "b": 3, "c": {"x": 2, "y": 3}, "d": {"z": 2}}
    assert applied == [{"key": "c.y", "old": 1, "new": 3}, {"key": "b", "old": 2, "new": 3}]
    assert layer("eval") == ({}, [])


def test_a_config_file_must_be_a_mapping(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("")
    assert read_config_file(f, "eval") == {}
    f.write_text("- a\n")
    with pytest.raises(InputError, match="expected a mapping of eval config keys"):
        read_config_file(f, "eval")
    f.write_text("c: 5\n")
    with pytest.raises(UsageError, match=r"c\.x \(from its flag\): 'x' is not inside a mapping"):
        layer("eval", file=f, flags={"c.x": 1})


def test_get_path_and_present():
    doc = {"a": {"b": 1}, "n": None, "seed": None}
    assert get_path(doc, "a.b") == 1 and get_path(doc, "a.c") is None and get_path(doc, "n.x") is None
    assert present(doc) == {"a": {"b": 1}, "seed": None}
