"""Scripted user simulator: answers the agent from the task's known facts with a few fixed rules.

Rules, in order, applied to each agent message:
  0. a message that would end the conversation (rule 1 or 6) while requests are still unrevealed
                                                 -> the user states the next request (τ²-bench's users reveal
                                                    their requests in turn, each once the previous is handled).
  1. "anything else?"                            -> the user is satisfied, says goodbye; episode ends.
  2. asks for identity (email / name / zip)      -> the user repeats how they identify themselves.
  3. asks for confirmation ("confirm", "proceed") -> "Yes, please go ahead."
  4. any other question                          -> the user restates the request (the latest revealed).
  5. announces a next step ("let me check")      -> "Okay." (narration does not end the conversation)
  6. a message that asks nothing                 -> the user says goodbye; episode ends.
A message "asks" when it contains '?' or an explicit request phrase ("please provide", "please confirm"...).
The rule set is deliberately simple and deterministic so that the reward depends only on the agent.
"""

from __future__ import annotations

import re

_ASKS = re.compile(
    r"\?|\b(please|kindly) (provide|confirm|share|tell|let me know|give)\b|\blet me know\b", re.I
)
_ANYTHING_ELSE = re.compile(r"\banything else\b|\bany other\b", re.I)
_IDENTITY = re.compile(
    r"\b(e-?mail|zip|postal|name|user ?id|identify|identity|verify|authenticat\w*)\b", re.I
)
_CONFIRM = re.compile(
    r"\b(confirm\w*|proceed|go ahead|shall i|should i|do you want|would you like|"
    r"yes or no|yes/no|is that (right|correct|ok))\b",
    re.I,
)

_ANNOUNCE = re.compile(
    r"\b(let me|one moment|just a moment|i will|i'll|i am going to|please wait|hold on)\b", re.I
)

GOODBYE = "Thanks, that's all. Bye!"


class ScriptedUser:
    """The user's side of one episode."""

    def __init__(self, identify: str, request: str, later: list[str] | tuple[str, ...] = ()):
        self.identify = identify
        self.request = request
        self.later = list(later)  # requests not stated yet, revealed one per handled request

    def _next_or_goodbye(self) -> tuple[str, bool]:
        if not self.later:
            return GOODBYE, True
        self.request = self.later.pop(0)
        return f"Thanks. One more thing: {self.request}", False

    def reply(self, agent_message: str) -> tuple[str, bool]:
        """Return (the user's reply, whether the user ends the conversation)."""
        text = agent_message or ""
        if _ANYTHING_ELSE.search(text):
            return self._next_or_goodbye()
        if not _ASKS.search(text):
            if _ANNOUNCE.search(text):
                return "Okay.", False
            return self._next_or_goodbye()
        if _IDENTITY.search(text):
            return self.identify, False
        if _CONFIRM.search(text):
            return "Yes, please go ahead.", False
        return f"As I said: {self.request}", False
