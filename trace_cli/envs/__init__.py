"""Environments: the protocol (base), the registry (make_env), the rollout loop, scripted replays and the built-in
`shop` world."""

from trace_cli.envs.base import Environment, Observation, RewardBreakdown, StepResult, tool_schema
from trace_cli.envs.registry import list_envs, make_env, register

__all__ = [
    "Environment",
    "Observation",
    "RewardBreakdown",
    "StepResult",
    "list_envs",
    "make_env",
    "register",
    "tool_schema",
]
