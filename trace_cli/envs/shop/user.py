"""Scripted user simulator: answers the agent from the task's known facts with a few fixed rules.

Rules, in order, applied to each agent message:
  1. "anything else?"                            -> the user is satisfied, says goodbye; episode ends.
  2. asks for identity (email / name / zip)      -> the user repeats how they identify themselves.
  3. asks for confirmation ("confirm", "proceed") -> "Yes, please go ahead."
  4. any other question                          -> the user restates the request.
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

    def __init__(self, identify: str, request: str):
        self.identify = identify
        self.request = request

    def reply(self, agent_message: str) -> tuple[str, bool]:
        """Return (the user's reply, whether the user ends the conversation)."""
        text = agent_message or ""
        if _ANYTHING_ELSE.search(text):
            return GOODBYE, True
        if not _ASKS.search(text):
            if _ANNOUNCE.search(text):
                return "Okay.", False
            return GOODBYE, True
        if _IDENTITY.search(text):
            return self.identify, False
        if _CONFIRM.search(text):
            return "Yes, please go ahead.", False
        return f"As I said: {self.request}", False
