"""τ²-bench's result models (the fields, types, defaults and enums an exported file must satisfy), transcribed
from sierra-research/tau2-bench a2c0247: src/tau2/data_model/simulation.py (Results, Info, SimulationRun,
RewardInfo, TerminationReason), message.py (SystemMessage, AssistantMessage, UserMessage, ToolMessage,
ToolCall), tasks.py (Task, UserScenario, StructuredUserInstructions, EvaluationCriteria, Action, RewardType)
and environment/{environment,toolkit}.py (EnvironmentInfo, ToolSignature). Audio, voice and review fields are
left out: they are optional there and never written by `trace export`. Extra keys are ignored, as there."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field


class TerminationReason(str, Enum):  # noqa: UP042 - as τ²-bench defines it
    USER_STOP = "user_stop"
    AGENT_STOP = "agent_stop"
    MAX_STEPS = "max_steps"
    TIMEOUT = "timeout"
    TOO_MANY_ERRORS = "too_many_errors"
    AGENT_ERROR = "agent_error"
    USER_ERROR = "user_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    CONTEXT_WINDOW_EXCEEDED = "context_window_exceeded"
    UNEXPECTED_ERROR = "unexpected_error"


class RewardType(str, Enum):  # noqa: UP042
    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class ToolCall(BaseModel):
    id: str = ""
    name: str
    arguments: dict
    requestor: Literal["user", "assistant"] = "assistant"


class SystemMessage(BaseModel):
    role: Literal["system"]
    content: str | None = None
    turn_idx: int | None = None


class _Participant(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    turn_idx: int | None = None
    cost: float | None = None
    usage: dict | None = None
    raw_data: dict | None = None

    def validate_content(self) -> None:  # τ²-bench's ParticipantMessageBase.validate()
        if not (self.content or self.tool_calls):
            raise ValueError(f"{type(self).__name__} must have either content or tool_calls")


class AssistantMessage(_Participant):
    role: Literal["assistant"]


class UserMessage(_Participant):
    role: Literal["user"]


class ToolMessage(BaseModel):
    id: str
    role: Literal["tool"]
    content: str | None = None
    requestor: Literal["user", "assistant"] = "assistant"
    error: bool = False
    turn_idx: int | None = None


Message = SystemMessage | AssistantMessage | UserMessage | ToolMessage


class DBCheck(BaseModel):
    db_match: bool
    db_reward: float


class RewardInfo(BaseModel):
    reward: float
    db_check: DBCheck | None = None
    reward_basis: list[RewardType] | None = Field(default_factory=lambda: [RewardType.DB])
    reward_breakdown: dict[RewardType, float] | None = None
    info: dict | None = None


class StructuredUserInstructions(BaseModel):
    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str


class UserScenario(BaseModel):
    persona: str | None = None
    instructions: StructuredUserInstructions | str


class Action(BaseModel):
    action_id: str
    requestor: Literal["user", "assistant"] = "assistant"
    name: str
    arguments: dict
    info: str | None = None
    compare_args: list[str] | None = None


class EvaluationCriteria(BaseModel):
    actions: list[Action] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE])


class Description(BaseModel):
    purpose: str | None = None
    relevant_policies: str | None = None
    notes: str | None = None


class Task(BaseModel):
    id: str
    description: Description | None = None
    user_scenario: UserScenario
    ticket: str | None = None
    evaluation_criteria: EvaluationCriteria | None = None


class ToolSignature(BaseModel):
    name: str
    doc: str
    params: dict | None = None
    returns: dict | None = None


class EnvironmentInfo(BaseModel):
    domain_name: str
    policy: str
    tool_defs: dict[str, ToolSignature] | None = None


class AgentInfo(BaseModel):
    implementation: str
    llm: str | None = None
    llm_args: dict | None = None


class UserInfo(BaseModel):
    implementation: str
    llm: str | None = None
    llm_args: dict | None = None
    global_simulation_guidelines: str | None = None


class Info(BaseModel):
    git_commit: str
    num_trials: int
    max_steps: int
    max_errors: int
    user_info: UserInfo
    agent_info: AgentInfo
    environment_info: EnvironmentInfo
    seed: int | None = None


class SimulationRun(BaseModel):
    id: str
    task_id: str
    timestamp: str | None = None
    start_time: str
    end_time: str
    duration: float
    termination_reason: TerminationReason
    agent_cost: float | None = None
    user_cost: float | None = None
    reward_info: RewardInfo | None = None
    messages: list[Message] | None = None
    trial: int | None = None
    seed: int | None = None
    mode: str = "half_duplex"
    info: dict | None = None
    policy: str | None = None


class Results(BaseModel):
    timestamp: str | None = None
    info: Info
    tasks: list[Task]
    simulations: list[SimulationRun] = Field(default_factory=list)
