"""The one protocol every agent implements, and the step from a model's generated text to a structured turn.

A policy drives many episodes at once: `act(states)` returns one `Turn` per `EpisodeState` (trace_cli.envs.
rollout), optionally after `begin(state)` has seen each new episode, and `close()` releases what it holds.
Policies that generate text parse it here (`text_turn`), with their model family's tool-call parser, so the
rollout loop below them gets actions and never parses text. Built-ins: agents.scripted (reference,
demonstration, random), agents.hf (a transformers model), agents.openai_policy (an OpenAI-compatible
endpoint), agents.token_history (GRPO's token-exact policy); compositions are in compose.policy, and
compose.policy.load_policy turns any model reference into one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trace_cli.envs.rollout import EpisodeState, Turn

Parser = Callable[[str], list[dict[str, Any]]]


class Policy(Protocol):
    """Anything the rollout loop can drive. `name` identifies it in results (a model reference, usually)."""

    name: str

    def act(self, states: list[EpisodeState]) -> Sequence[Turn | list[dict[str, Any]]]:
        """One structured turn per state, in order: a Turn, or a bare list of actions (a scripted turn)."""
        ...


def text_turn(raw: str, parse: Parser | None = None) -> Turn:
    """A generated turn -> a Turn: its actions as `parse` finds them (the model family's parser, by default
    Hermes `<tool_call>` blocks: models.chat.parse_assistant), and what its assistant message shows: with a
    malformed call the raw text up to the end-of-turn marker (the transcript and the next prompt show exactly
    what the agent wrote; the template adds its own marker), else the text outside the calls (what a
    non-Hermes parser returns as a `content` action, or the Hermes text around the blocks, `<think>` dropped)."""
    from trace_cli.models.chat import TOOL_CALL_RE, cut_at_end, parse_assistant, strip_text

    actions = (parse or parse_assistant)(raw)
    calls = [a for a in actions if "name" in a or "malformed" in a]
    if not calls:
        return Turn(actions, raw=raw)
    if any("malformed" in a for a in calls):
        return Turn(actions, cut_at_end(raw), raw)
    said = next((a["content"] for a in actions if "content" in a and "name" not in a), None)
    return Turn(actions, said if said is not None else TOOL_CALL_RE.sub("", strip_text(raw)).strip(), raw)


def as_turn(out: str | list[dict[str, Any]] | Turn, parse: Parser | None = None) -> Turn:
    """A policy's output for one episode as a Turn: generated text is parsed (`text_turn`), a list of actions
    is a structured turn."""
    if isinstance(out, Turn):
        return out
    if isinstance(out, str):
        return text_turn(out, parse)
    return Turn(list(out))


__all__ = ["EpisodeState", "Parser", "Policy", "Turn", "as_turn", "text_turn"]
