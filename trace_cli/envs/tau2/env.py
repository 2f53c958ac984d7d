"""`Tau2Env`: one of τ²-bench's own domains (retail, airline, telecom) as a trace environment.

Everything the agent meets is τ²'s: the system prompt (`<instructions>` + the domain policy, τ²'s `LLMAgent`
prompt; telecom solo: `LLMSoloAgent`'s, with the ticket), the tool schemas (`Tool.openai_schema`), τ²'s greeting
as the first agent message, the tool outputs and error texts (`Environment.get_response` on a private copy of the
domain's pristine DB, with the task's initial state applied), and the reward (see `grading`).

Counting is τ²'s orchestrator's: every message of every party is a step (one assistant message with k tool calls
is one step, their k results one more); `max_steps` and `max_errors` are checked where τ² checks them (not
between a tool call and its result), and only the user may end a retail/airline conversation (its stop tokens);
in telecom's solo mode the agent ends with the `done` tool and a message to nobody is an agent error.
The rollout loop tells the environment where an assistant turn begins (`begin_turn`), so a turn with several
calls is one τ² message; the loop's own turn cap does not apply (`own_budget`).

Seeds index the split's tasks in τ²'s order (seed % number of tasks: several trials or GRPO groups of one task
share its seed).
"""

from __future__ import annotations

import json
from typing import Any

from trace_cli.envs.base import Observation, RewardBreakdown, StepResult
from trace_cli.envs.tau2 import grading
from trace_cli.envs.tau2.package import Domain, tau2
from trace_cli.envs.tau2.users import GREETING, STOP, TRANSFER, LLMUser, ScriptedUser, UserFailed, is_stop
from trace_cli.errors import UsageError


class Tau2Env:
    """`tau2-<domain>?split=…&user=…&max_steps=…`; satisfies `trace_cli.envs.base.Environment`."""

    own_budget = True  # the rollout loop leaves max_steps / max_errors to τ²'s counting here

    def __init__(
        self,
        dom: Domain,
        *,
        split: str,
        user: str,
        max_steps: int,
        max_errors: int,
        user_client: Any = None,
        judge_client: Any = None,
        tasks: list[Any] | None = None,
    ):
        self.domain = dom
        self.name = f"tau2-{dom.name}"
        self.split = split
        self.user_kind = user
        self.solo = user == "solo"
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.max_turns = max_steps  # an agent turn is at least one step: the episode's upper bound in turns
        self.user_client = user_client
        self.judge_client = judge_client
        # steps wait on a server: the rollout loop steps this round's episodes together (a batching server
        # then sees their user turns at once)
        self.concurrent_steps = user_client is not None or judge_client is not None
        self.tasks = tasks if tasks is not None else dom.tasks(split)
        if not self.tasks:
            raise UsageError(f"{self.name}: split {split!r} has no tasks")
        grading.check_bases(self.name, self.tasks, judge_client)
        tools = list(dom.tools)
        if self.solo:
            tools = tools + list(dom.user_tools) + [grading.done_tool_schema()]
        self.tool_schemas = tools
        self._by_name = {t["function"]["name"]: t for t in tools}
        self.task: Any = None
        self.seed: int | None = None

    # -- protocol ----------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise UsageError(f"seed must be a non-negative integer, got {seed!r}")
        tau2()
        from tau2.data_model.message import AssistantMessage

        self.seed = seed
        self.task = self.tasks[seed % len(self.tasks)]
        self.env = self.domain.environment(solo_mode=self.solo)
        init = self.task.initial_state
        if init is not None:
            if init.message_history:
                raise UsageError(
                    f"{self.name}: task {self.task.id} starts from a message history, which trace does not "
                    "replay yet"
                )
            self.env.set_state(init.initialization_data, init.initialization_actions, [])
        self.trajectory: list[Any] = []
        self.steps = 0
        self.errors = 0
        self.done = False
        self.termination: str | None = None
        self._pending: list[Any] = []  # the calls of the current assistant message not answered yet
        self._results: list[Any] = []
        self._verdict: RewardBreakdown | None = None
        messages: list[dict[str, Any]] = []
        if self.solo:
            system = grading.solo_system_prompt(self.domain, self.task)
        else:
            system = grading.agent_system_prompt(self.domain)
            self.user = self._make_user()
            self.trajectory.append(AssistantMessage(role="assistant", content=GREETING))
            try:
                first = (
                    self.user.opening() if isinstance(self.user, ScriptedUser) else self.user.reply(GREETING)
                )
            except UserFailed:
                first = ""
                self._finish("user_error")
            else:
                self._user_said(first)
            messages = [{"role": "assistant", "content": GREETING}, {"role": "user", "content": first}]
            self._check_budget()
        return Observation(
            system_prompt=system,
            tools=[json.loads(json.dumps(t)) for t in self.tool_schemas],
            messages=messages,
            task_id=self.task.id,
            info={
                "env": self.name,
                "seed": seed,
                "split": self.split,
                "user": self.user_kind,
                "max_steps": self.max_steps,
                "tau2": self.domain.fingerprint,
                "tau2_comparable": self.user_kind != "scripted",
            },
        )

    def _make_user(self) -> Any:
        if self.user_kind == "llm":
            return LLMUser(self.task, self.user_client, seed=self.seed)
        return ScriptedUser(self.task)

    def begin_turn(self, text: str | None, n_calls: int, n_malformed: int = 0) -> None:
        """The rollout loop starts an assistant turn with `n_calls` well-formed tool calls (stepped next) and
        `n_malformed` calls it answers itself with an error (τ²: one message, then one error result)."""
        if self.done or (n_calls == 0 and n_malformed == 0):
            return
        from tau2.data_model.message import AssistantMessage

        msg = AssistantMessage(role="assistant", content=text or None, tool_calls=[])
        self.trajectory.append(msg)
        self.steps += 1
        self._pending = [msg] * n_calls
        self.errors += n_malformed  # answered with an error by the loop, never reaching τ²'s tools
        if n_calls == 0:  # only malformed calls: their error results are the environment's step
            self.steps += 1
            self._check_budget()

    def step(self, action: dict[str, Any]) -> StepResult:
        if self.task is None:
            raise UsageError("call reset(seed) before using the environment")
        if self.done:
            return StepResult(
                "Error: the episode is over",
                role="user",
                done=True,
                error=True,
                info={"termination": self.termination},
            )
        if isinstance(action, dict) and "name" in action:
            text, error = self._tool_call(action)
            role = "tool"
        elif isinstance(action, dict) and isinstance(action.get("content"), str):
            text, error, role = self._message(action["content"]), False, "user"
        else:
            text, error, role = (
                'Error: an action is a tool call {"name", "arguments"} or a message {"content"}',
                True,
                "tool",
            )
        return StepResult(
            text,
            role=role,
            done=self.done,
            reward=self.verify().reward if self.done else 0.0,
            error=error,
            info={"termination": self.termination, "steps": self.steps},
        )

    def _tool_call(self, action: dict[str, Any]) -> tuple[str, bool]:
        from tau2.data_model.message import AssistantMessage, ToolCall

        if not self._pending:  # a call outside begin_turn (a replayed plan): a message of its own
            self.begin_turn(None, 1)
        msg = self._pending.pop(0)
        name, args = action.get("name"), action.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        call_id = f"call_{len(self.trajectory)}_{len(msg.tool_calls)}"
        if not isinstance(args, dict):
            args = {}
            bad = f"Error: {name}: arguments must be a JSON object"
        else:
            bad = None
        if name == grading.DONE and self.solo:  # LLMSoloAgent turns its `done` call into the stop token
            msg.content, msg.tool_calls = STOP, None
            self._pending = []
            self._finish("agent_stop")
            return STOP, False
        call = ToolCall(id=call_id, name=str(name), arguments=args, requestor="assistant")
        msg.tool_calls.append(call)
        if bad is None and name not in self._by_name:
            bad = f"Error: Tool '{name}' not found."
        if bad is None:
            result = self.env.get_response(call)
        else:
            from tau2.data_model.message import ToolMessage

            result = ToolMessage(id=call_id, role="tool", content=bad, requestor="assistant", error=True)
        self._results.append(result)
        self.errors += int(result.error)
        if name == "transfer_to_human_agents" and not result.error and hasattr(self, "user"):
            if isinstance(self.user, ScriptedUser):
                self.user.transferred = True
        if not self._pending:  # every call of this message answered: τ²'s environment step
            self.trajectory.extend(self._results)
            self._results = []
            self.steps += 1
            self._check_budget()
        if isinstance(msg, AssistantMessage) and not msg.tool_calls:
            msg.tool_calls = None
        return result.content or "", bool(result.error)

    def _message(self, content: str) -> str | None:
        from tau2.data_model.message import AssistantMessage

        self._pending = []
        self.trajectory.append(AssistantMessage(role="assistant", content=content))
        self.steps += 1
        if self.solo:  # τ²: in solo mode a message (not a stop) ends the episode as an agent error
            self._finish("agent_stop" if STOP in content else "agent_error")
            return None
        if self._check_budget():
            return None
        try:
            reply = self.user.reply(content)
        except UserFailed:
            self._finish("user_error")
            return None
        self._user_said(reply)
        if is_stop(reply):
            self._finish("user_stop")
            return reply
        self._check_budget()
        return reply

    def _user_said(self, text: str) -> None:
        from tau2.data_model.message import UserMessage

        self.trajectory.append(UserMessage(role="user", content=text))
        self.steps += 1

    def _check_budget(self) -> bool:
        if self.done:
            return True
        if self.steps >= self.max_steps:
            self._finish("max_steps")
        elif self.errors >= self.max_errors:
            self._finish("too_many_errors")
        return self.done

    def _finish(self, why: str) -> None:
        self.done, self.termination = True, why

    def verify(self) -> RewardBreakdown:
        if self.task is None:
            raise UsageError("call reset(seed) before using the environment")
        if self._verdict is not None:
            return self._verdict
        verdict = grading.grade(
            self.domain,
            self.task,
            self.trajectory_messages(),
            self.termination,
            solo=self.solo,
            judge=self.judge_client,
        )
        if self.done:
            self._verdict = verdict
        return verdict

    def trajectory_messages(self) -> list[Any]:
        """τ²'s messages of the episode so far (results of a message whose calls are not all answered yet
        included), as τ²'s evaluators read them."""
        return [*self.trajectory, *self._results]

    def task_metadata(self) -> dict[str, Any]:
        if self.task is None:
            raise UsageError("call reset(seed) before using the environment")
        crit = self.task.evaluation_criteria
        return {
            "task_id": self.task.id,
            "family": f"{self.domain.name}",
            "split": self.split,
            "user": self.user_kind,
            "tau2": self.domain.fingerprint,
            "episode_info": {"tau2_env": self.export_info()},
            "reward_basis": [
                str(b.value if hasattr(b, "value") else b) for b in (crit.reward_basis if crit else [])
            ],
            "required_capabilities": [],
            "reference_actions": self.reference_actions(),
        }

    def export_info(self) -> dict[str, Any]:
        """What `trace export tau2` needs to write τ²'s own results file: the task as τ² defines it, the data
        fingerprint, the user simulator (a scripted user's runs are labelled: not τ²-bench scores)."""
        return {
            "domain": self.domain.name,
            "split": self.split,
            "user": self.user_kind,
            "user_model": getattr(getattr(self.user_client, "ep", None), "display", None),
            "comparable": self.user_kind != "scripted",
            "solo": self.solo,
            "max_steps": self.max_steps,
            "max_errors": self.max_errors,
            "fingerprint": self.domain.fingerprint,
            "task": self.task.model_dump(mode="json", exclude_none=True),
        }

    def reference_actions(self) -> list[dict[str, Any]]:
        """The task's gold actions, then (with a user) one message that says what the task's `communicate_info`
        asks for and whether there is anything else (the scripted user then ends the conversation), or (solo)
        the `done` call."""
        if self.task is None:
            raise UsageError("call reset(seed) before using the environment")
        crit = self.task.evaluation_criteria
        plan = [
            {"name": a.name, "arguments": json.loads(json.dumps(a.arguments))}
            for a in ((crit.actions if crit else None) or [])
        ]
        if self.solo:
            return [*plan, {"name": grading.DONE, "arguments": {}}]
        facts = list((crit.communicate_info if crit else None) or [])
        said = f"To confirm: {'; '.join(facts)}. " if facts else ""
        transferred = any(a["name"] == "transfer_to_human_agents" for a in plan)
        tail = (
            "You are being transferred to a human agent."
            if transferred
            else ("Is there anything else I can help you with?")
        )
        return [*plan, {"content": f"{said}{tail}"}]


__all__ = ["Tau2Env", "TRANSFER"]
