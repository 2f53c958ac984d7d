"""The environment protocol (ARCHITECTURE.md, "Environments and capability templates"): reset(seed) -> Observation, step(action) -> StepResult, verify().

Actions are plain dicts, the same shape an agent's parsed output has:
  * a tool call:        {"name": "get_order", "arguments": {"order_id": "#W1001"}}
  * a message to user:  {"content": "Your order has been cancelled."}
Tool calls whose name is not a tool, or whose arguments do not match the schema, are answered with an
error observation (`StepResult.error = True`), as τ²-bench does; they never raise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Observation:
    """What the agent sees at the start: system prompt (policy), tool schemas, opening messages."""

    system_prompt: str
    tools: list[dict[str, Any]]  # OpenAI function format: {"type": "function", "function": {...}}
    messages: list[dict[str, Any]]  # the opening conversation, e.g. [{"role": "user", "content": "..."}]
    task_id: str
    info: dict[str, Any] = field(default_factory=dict)  # public info only (never the hidden task metadata)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepResult:
    """The environment's answer to one action."""

    observation: str  # tool result text (role "tool") or the user's reply (role "user")
    role: str  # "tool" or "user"
    done: bool
    reward: float = 0.0  # reward so far; final when done
    error: bool = False  # the tool call failed (unknown tool, bad arguments, policy/state error)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardBreakdown:
    """Programmatic, deterministic verdict on the episode so far."""

    reward: float
    success: bool
    components: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """What every environment implements. Same seed => same task, state and reward for the same actions."""

    name: str
    max_turns: int

    def reset(self, seed: int) -> Observation: ...

    def step(self, action: dict[str, Any]) -> StepResult: ...

    def verify(self) -> RewardBreakdown: ...

    def task_metadata(self) -> dict[str, Any]:
        """Hidden metadata (task family, required capabilities, reference actions). Never shown to agents."""
        ...

    def reference_actions(self) -> list[dict[str, Any]]:
        """A sequence of actions that reaches reward 1 from the current task's reset state."""
        ...


def is_tool_call(action: dict[str, Any]) -> bool:
    return "name" in action


def tool_schema(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """Build one tool definition in OpenAI function format (unknown arguments are rejected)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }
