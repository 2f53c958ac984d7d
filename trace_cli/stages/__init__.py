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
    if name not in STAGES:
        raise UsageError(f"unknown stage {name!r}; expected one of: {', '.join(sorted(STAGES))}")
    return importlib.import_module(STAGES[name])


def config_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of stage `name`'s config: the module's CONFIG_SCHEMA, else the shipped file."""
    from trace_cli.config.schemas import load_schema

    if name in STAGES:
        own = getattr(get_stage(name), "CONFIG_SCHEMA", None)
        if own is not None:
            return own
    return load_schema(f"config/{name}.v1.json")
