"""Synthetic capability environments: one template per capability, built on the target's tools and world.

`TEMPLATES` maps a capability name to its template class; `make_template(name, **params)` builds one.
Templates reuse the target's tool schemas (shop's, or ones recovered from rollouts with `recover_tools`).
"""

from __future__ import annotations

from typing import Any

from trace_cli.envs.synthetic.base import Scenario, SyntheticEnv
from trace_cli.envs.synthetic.multi_step_completion import MultiStepCompletion
from trace_cli.envs.synthetic.policy_compliance_under_pressure import PolicyComplianceUnderPressure
from trace_cli.envs.synthetic.precondition_verification import PreconditionVerification
from trace_cli.envs.synthetic.recover import recover_tools
from trace_cli.envs.synthetic.structured_data_reasoning import StructuredDataReasoning
from trace_cli.envs.synthetic.tool_calling_precision import ToolCallingPrecision
from trace_cli.errors import UsageError

TEMPLATES: dict[str, type[SyntheticEnv]] = {
    cls.capability: cls
    for cls in (
        PreconditionVerification,
        StructuredDataReasoning,
        MultiStepCompletion,
        ToolCallingPrecision,
        PolicyComplianceUnderPressure,
    )
}


def get_template(name: str) -> type[SyntheticEnv]:
    if name not in TEMPLATES:
        raise UsageError(
            f"no environment template for capability {name!r}; templates: {', '.join(TEMPLATES)}",
            hint="use an LLM author (--author openai|hf) for other capabilities",
        )
    return TEMPLATES[name]


def make_template(name: str, **params: Any) -> SyntheticEnv:
    return get_template(name)(**params)


__all__ = ["TEMPLATES", "Scenario", "SyntheticEnv", "get_template", "make_template", "recover_tools"]
