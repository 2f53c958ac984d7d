"""`step()` shared by environments made of tools plus a scripted user (the shop world and its synthetic
capability environments): count the turn, run a tool call or pass a message to the user, end the episode on
the user's goodbye, a transfer (where the environment says so) or max_turns, and report the reward so far.

`max_turns` counts agent turns, as the stages' `max_turns` and the rollout loop's cap do: an assistant turn with
several tool calls is one turn. The loop says where a turn begins (`begin_turn`, with its number of calls); a
caller that steps actions without it (a replayed plan, a sandboxed module's proxy) makes each action its own turn."""

from __future__ import annotations

from typing import Any, ClassVar

from trace_cli.envs.base import StepResult


class ScriptedConversation:
    """Mixin. The class provides `_started()` (raises before reset), `_tool_call(action) -> (text, error)`,
    `verify()`, and the attributes `user`, `max_turns`, `turns`, `done`, `termination`, `agent_messages`."""

    ends_on_transfer: ClassVar[bool] = True  # a successful transfer_to_human_agents call ends the episode
    _calls_in_turn: int = 0  # tool calls of the current turn not stepped yet
    _turn_first: bool = False  # the current turn's first call is still to come

    def begin_turn(self, text: str | None, n_calls: int, n_malformed: int = 0) -> None:
        """The rollout loop starts an assistant turn whose `n_calls` well-formed tool calls come next: the turn
        is counted once, at its first call."""
        self._calls_in_turn, self._turn_first = n_calls, True

    def step(self, action: dict[str, Any]) -> StepResult:
        self._started()
        if self.done:
            return StepResult(
                "Error: the episode is over",
                role="user",
                done=True,
                reward=self.verify().reward,
                error=True,
                info={"termination": self.termination},
            )
        if isinstance(action, dict) and "name" in action and self._calls_in_turn > 0:
            if self._turn_first:  # the turn is counted at its first call
                self.turns += 1
                self._turn_first = False
            self._calls_in_turn -= 1
        else:  # a message, or a call stepped outside a turn: a turn of its own
            self.turns += 1
            self._calls_in_turn = 0
        if isinstance(action, dict) and "name" in action:
            observation, error, role = *self._tool_call(action), "tool"
            if self.ends_on_transfer and action.get("name") == "transfer_to_human_agents" and not error:
                self._finish("transfer")
        elif isinstance(action, dict) and "content" in action:
            role, error = "user", False
            content = action["content"]
            if not isinstance(content, str):
                observation, error = "Error: a message's content must be a string", True
            else:
                self.agent_messages.append(content)
                observation, ends = self.user.reply(content)
                if ends:
                    self._finish("user_stop")
        else:
            observation, error, role = (
                'Error: an action is a tool call {"name", "arguments"} or a message {"content"}',
                True,
                "tool",
            )
        if not self.done and self.turns >= self.max_turns:
            self._finish("max_turns")
        return StepResult(
            observation,
            role=role,
            done=self.done,
            reward=self.verify().reward,
            error=error,
            info={"turn": self.turns, "termination": self.termination},
        )

    def _finish(self, why: str) -> None:
        self.done, self.termination = True, why
