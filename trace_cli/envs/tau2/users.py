"""The user side of a τ²-bench episode: `user=llm` (τ²'s own user-simulator prompt sent to any OpenAI-compatible
endpoint) and `user=scripted` (deterministic, from the task's structured instructions; NOT τ²-bench).

`LLMUser` re-implements τ²'s `UserSimulator` without litellm: system prompt = τ²'s simulation guidelines plus
`str(task.user_scenario)` (τ²'s `SYSTEM_PROMPT`), the conversation with roles flipped (what the agent said is the
"user" of the simulator, what the simulator said is its "assistant"), and τ²'s stop tokens (`###STOP###`,
`###TRANSFER###`, `###OUT-OF-SCOPE###`) end the conversation. The paper's setting is the agent's own base model
as the user, served beside it (`trace serve`, vLLM).

`ScriptedUser` states the reason for the call with the known facts about itself (pronouns turned to the first
person), answers identity questions with its known info, says yes to a confirmation, ends with τ²'s stop token
when the agent asks whether there is anything else or says something that asks nothing, and after a successful
transfer ends with `###TRANSFER###`. Its conditional, regret and persona clauses are not acted out: runs with it
are labelled `user=scripted` and are not τ²-bench scores.
"""

from __future__ import annotations

import re
from typing import Any

from trace_cli.envs.worlds.user import _ANNOUNCE, _ANYTHING_ELSE, _ASKS, _CONFIRM
from trace_cli.errors import UsageError

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"  # τ²'s DEFAULT_FIRST_AGENT_MESSAGE


def is_stop(text: str | None) -> bool:
    return bool(text) and any(t in text for t in STOP_TOKENS)


def user_system_prompt(task: Any) -> str:
    """τ²'s user-simulator system prompt for `task` (guidelines without user tools, then the scenario)."""
    from trace_cli.envs.tau2.package import data_file, source_constant

    # τ²'s user_simulator module imports litellm: its prompt is read from its source, its guidelines from data
    return source_constant("tau2.user.user_simulator", "SYSTEM_PROMPT").format(
        global_user_sim_guidelines=data_file("tau2", "user_simulator", "simulation_guidelines.md"),
        instructions=str(task.user_scenario),
    )


class LLMUser:
    """τ²'s user simulator on an OpenAI-compatible endpoint (`user_model=openai:URL?model=NAME`)."""

    kind = "llm"

    def __init__(self, task: Any, client: Any, *, seed: int | None = None):
        self.system = user_system_prompt(task)
        self.client = client
        self.seed = seed
        self.history: list[dict[str, str]] = []  # flipped: the agent's messages are "user", ours "assistant"

    def reply(self, agent_message: str) -> str:
        """The simulator's next message; `UserFailed` when it answers with no text (τ²: a user error, which
        ends the episode unscored); a server that cannot be reached is the run's error (exit 2)."""
        from trace_cli.llm.openai_client import MalformedReply, Unavailable

        self.history.append({"role": "user", "content": agent_message})
        try:
            reply = self.client.complete(
                [{"role": "system", "content": self.system}, *self.history], seed=self.seed
            )
        except Unavailable as e:
            raise UsageError(f"the user simulator {self.client.ep.display} failed: {e}") from None
        try:
            text = _strip_thinking(reply.text())
        except MalformedReply as e:
            raise UserFailed(str(e)) from None
        self.history.append({"role": "assistant", "content": text})
        return text


class UserFailed(Exception):
    """The user simulator's answer is not a message (empty, malformed): τ²'s USER_ERROR."""


def _strip_thinking(text: str) -> str:
    """A reasoning model's `<think>…</think>` never reaches the agent."""
    return re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip() or text


# -- the scripted user ------------------------------------------------------------------------------------
# the shop's scripted-user rules (envs/worlds/user.py), with a phone number as one more identity question
_IDENTITY = re.compile(
    r"\b(e-?mail|zip|postal|name|user ?id|identify|identity|verify|authenticat\w*|phone)\b", re.I
)

# second person -> first person, longest first; case kept for a leading capital
_FLIPS = [
    (r"\byou are\b", "I am"),
    (r"\byou're\b", "I'm"),
    (r"\byou've\b", "I've"),
    (r"\byou'd\b", "I'd"),
    (r"\byou'll\b", "I'll"),
    (r"\byourself\b", "myself"),
    (r"\byours\b", "mine"),
    (r"\byour\b", "my"),
    (r"\b(to|for|with|from|about|give|send|tell|let|ask|call|help|told|asked) you\b", r"\1 me"),
    (r"\byou\b", "I"),
]


def first_person(text: str) -> str:
    """'You are Yusuf Rossi in zip code 19122.' -> 'I am Yusuf Rossi in zip code 19122.' (good enough for a
    scripted user; the LLM user reads τ²'s instructions as they are)."""
    out = text
    for pattern, repl in _FLIPS:

        def sub(m: re.Match, repl: str = repl) -> str:
            text = m.expand(repl)
            return text[0].upper() + text[1:] if m.group(0)[0].isupper() else text

        out = re.sub(pattern, sub, out, flags=re.I)
    return out


def _field(instructions: Any, name: str) -> str:
    value = getattr(instructions, name, None)
    return value.strip() if isinstance(value, str) else ""


class ScriptedUser:
    """Deterministic user from a task's structured instructions (see the module docstring)."""

    kind = "scripted"

    def __init__(self, task: Any):
        ins = task.user_scenario.instructions
        if isinstance(ins, str):
            self.known, self.request = "", ins.strip()
        else:
            self.known = _field(ins, "known_info")
            self.request = _field(ins, "reason_for_call")
        self.identify = first_person(self.known) if self.known else "I don't have more details."
        self.transferred = False

    def opening(self) -> str:
        return " ".join(p for p in (self.identify if self.known else "", first_person(self.request)) if p)

    def reply(self, agent_message: str) -> str:
        text = agent_message or ""
        if self.transferred:
            return TRANSFER
        if _ANYTHING_ELSE.search(text):
            return STOP
        if not _ASKS.search(text):
            return "Okay." if _ANNOUNCE.search(text) else STOP
        if _IDENTITY.search(text):
            return self.identify
        if _CONFIRM.search(text):
            return "Yes, please go ahead."
        return f"As I said: {first_person(self.request)}"
