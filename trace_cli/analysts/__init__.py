"""Diagnose back-ends ("analysts"): `rules` (deterministic detectors), `openai` (any OpenAI-compatible chat
server) and `hf` (a local transformers model). All label (trajectory, capability) pairs NA/PRESENT/LACKING."""

from __future__ import annotations

from typing import Any

from trace_cli.errors import UsageError

ANALYSTS = ("rules", "openai", "hf")


def get_analyst(name: str, config: dict[str, Any], store: Any = None):
    if name == "rules":
        from trace_cli.analysts.rules import RulesAnalyst

        return RulesAnalyst(config)
    if name == "openai":
        from trace_cli.analysts.openai import OpenAIAnalyst

        return OpenAIAnalyst(config, store)
    if name == "hf":
        from trace_cli.analysts.hf import HFAnalyst

        return HFAnalyst(config, store)
    raise UsageError(f"unknown analyst {name!r}; expected one of: {', '.join(ANALYSTS)}")
