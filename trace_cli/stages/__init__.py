"""Stages: plain functions `prepare(config, store)` / `run(prepared, store)`; no click here.

`STAGES` maps a recipe's `uses:` name to the module implementing it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trace_cli.errors import UsageError

STAGES: dict[str, str] = {
    "ingest": "trace_cli.stages.ingest",
}


def get_stage(name: str) -> ModuleType:
    if name not in STAGES:
        raise UsageError(f"unknown stage {name!r}; expected one of: {', '.join(sorted(STAGES))}")
    return importlib.import_module(STAGES[name])
