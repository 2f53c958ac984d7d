"""One choice of one request as the engine runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """One choice of one request, from admission to its last token. The worker thread owns every field but
    `cancelled`, which the request's side sets when its client goes away."""

    prompt_ids: list[int]
    max_tokens: int
    # thread-safe: ("start", route) | ("text", text, n) | ("done", text, ids, finish) | ("error", exc)
    emit: Callable[[tuple], None]
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    forced: list[list[int]] | None = None  # token sequences the completion must start with (one of them)
    messages: list[dict[str, Any]] | None = None  # the conversation (a router routes on it)
    seed: int | None = None
    adapter: str | None = None  # the LoRA adapter that generates it (None: the base model)
    stop_ids: tuple[int, ...] = ()  # token ids that end it besides the model's own stop tokens
    top_k: int = 0  # sampling: the k most likely tokens only (0 = off)
    want_logprobs: bool = False  # record each generated token's log-probability (`logprobs`)
    cancelled: bool = False
    # worker state
    cached: int = 0  # prompt tokens served from the prefix cache
    ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    key: tuple | None = None  # a router's decision (rows with equal keys share a batch)
    route: dict[str, float] | None = None
    close_json: bool = False  # forced call: end when the arguments' JSON object closes
    _gen: Any = None
    _forced_len: int = 0
    _forced_done: bool = False

    def cancel(self) -> None:
        self.cancelled = True
