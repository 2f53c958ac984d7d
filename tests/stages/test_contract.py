"""The stage contract is a declared interface (`stages.contract.Stage`), checked when a stage is loaded; its
optional members have their defaults in one place (`StageOptions`)."""

from __future__ import annotations

import sys
import types

import pytest

from trace_cli.stages import STAGES, get_stage
from trace_cli.stages.contract import Stage, StageOptions, stage_options


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_registered_stage_satisfies_the_contract(name):
    assert isinstance(get_stage(name), Stage)


def test_a_module_without_run_is_refused_when_loaded(monkeypatch):
    mod = types.ModuleType("half_stage")
    mod.NAME, mod.OUTPUTS = "half", {"report": "eval"}
    mod.prepare = lambda config, store: None
    monkeypatch.setitem(sys.modules, "half_stage", mod)
    monkeypatch.setitem(STAGES, "half", "half_stage")
    with pytest.raises(TypeError, match="lacks run of the stage contract"):
        get_stage("half")


def test_options_a_stage_leaves_out_take_their_declared_defaults():
    synthesize, eval_ = get_stage("synthesize"), get_stage("eval")
    assert stage_options(synthesize).CACHE_FAILURES is True
    assert stage_options(synthesize).fans_out is synthesize.fans_out
    assert stage_options(eval_) == StageOptions()
    assert stage_options(get_stage("ingest")).PATH_KEYS == ("path",)
