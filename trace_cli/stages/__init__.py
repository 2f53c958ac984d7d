"""Stages: plain functions `prepare(config, store)` / `run(prepared, store)`; no click here.

`STAGES` maps a recipe's `uses:` name to the module implementing it. A stage's config is validated against
`schemas/config/<name>.v1.json`, or against the module's `CONFIG_SCHEMA` dict when it defines one (stages
registered from outside the package, e.g. plug-ins and test stages, which ship no schema file).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from trace_cli.errors import UsageError

STAGES: dict[str, str] = {
    "ingest": "trace_cli.stages.ingest",
    "model": "trace_cli.stages.model",
    "pretrain": "trace_cli.stages.pretrain",
    "eval": "trace_cli.stages.eval",
    "train": "trace_cli.stages.train",
    "diagnose": "trace_cli.stages.diagnose",
    "synthesize": "trace_cli.stages.synthesize",
    "compose": "trace_cli.stages.compose",
}


def get_stage(name: str) -> ModuleType:
    """The module of stage `name`, checked against the stage contract (`stages.contract.Stage`)."""
    from trace_cli.stages.contract import Stage

    if name not in STAGES:
        raise UsageError(f"unknown stage {name!r}; expected one of: {', '.join(sorted(STAGES))}")
    module = importlib.import_module(STAGES[name])
    if not isinstance(module, Stage):
        missing = [m for m in ("NAME", "OUTPUTS", "prepare", "run") if not hasattr(module, m)]
        raise TypeError(f"stage {name!r} ({STAGES[name]}) lacks {', '.join(missing)} of the stage contract")
    return module


def config_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of stage `name`'s config: the module's CONFIG_SCHEMA, else the shipped file."""
    from trace_cli.config.schemas import load_schema

    if name in STAGES:
        from trace_cli.stages.contract import stage_options

        own = stage_options(get_stage(name)).CONFIG_SCHEMA
        if own is not None:
            return own
    return load_schema(f"config/{name}.v1.json")
