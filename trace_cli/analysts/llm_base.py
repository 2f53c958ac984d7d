"""What the model-backed analysts (`openai`, `hf`) share: their `llm` settings, with the defaults the diagnose
schema states (schemas/config/diagnose.v1.json, `llm`), and the analyst API on top of two ways of asking:
one prompt (`_ask_one`) and many (`_ask_all`), each answer parsed or the reason it failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trace_cli.analysts.base import Candidate, Label, Trajectory
from trace_cli.analysts.cache import ResponseCache
from trace_cli.analysts.prompts import (
    PromptLimits,
    discovery_messages,
    labelling_messages,
    parse_discovery,
    parse_labels,
    to_labels,
)
from trace_cli.errors import UsageError

T = TypeVar("T")
Answer = tuple[T | None, str | None]  # (parsed, None) or (None, why it failed)


def llm_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The config's `llm` block over the schema's defaults (a key given as null keeps the default)."""
    from trace_cli.config.schemas import load_schema

    block = load_schema("config/diagnose.v1.json")["properties"]["llm"]["properties"]
    defaults = {k: v["default"] for k, v in block.items() if v.get("default") is not None}
    return {**defaults, **{k: v for k, v in (config.get("llm") or {}).items() if v is not None}}


class LLMAnalyst:
    """Discovery and labelling by a language model; subclasses say how one prompt and many are asked."""

    name = ""
    deterministic = False

    def __init__(self, llm: dict[str, Any], store: Any):
        self.temperature = float(llm["temperature"])
        self.max_tokens = int(llm["max_tokens"])
        self.limits = PromptLimits.from_config(llm)
        self.cache = ResponseCache.for_store(store, self.name, bool(llm["cache"]))

    # set by each subclass: one prompt asked and its answer parsed, and many, answers in the prompts' order
    _ask_one: Callable[..., Answer]  # (messages, *, run, seed, parse, what)
    _ask_all: Callable[..., list[Answer]]  # (prompts, *, run, seed, parse, what)

    def discover(self, episodes: list[dict[str, Any]], max_candidates: int, seed: int) -> list[Candidate]:
        trajs = [Trajectory.from_episode(e) for e in episodes]
        ids = {t.task_id for t in trajs}
        cands, why = self._ask_one(
            discovery_messages(trajs, max_candidates, self.limits),
            run=-1,
            seed=seed,
            parse=lambda s: parse_discovery(s, max_candidates, ids),
            what="discovering capabilities",
        )
        if not cands:
            raise UsageError(
                f"capability discovery failed: {why}",
                hint="use --candidates catalog, or a stronger analyst model",
            )
        return cands

    def label(
        self, episodes: list[dict[str, Any]], candidates: list[Candidate], run: int, seed: int
    ) -> list[Label]:
        names = [c.name for c in candidates]
        trajs = [Trajectory.from_episode(e) for e in episodes]
        answers = self._ask_all(
            [labelling_messages(t, candidates, self.limits) for t in trajs],
            run=run,
            seed=seed,
            parse=lambda s: parse_labels(s, names),
            what=f"labelling (run {run + 1})",
        )
        out: list[Label] = []
        for t, (parsed, why) in zip(trajs, answers, strict=True):
            out += to_labels(t.episode_id, names, run, parsed, why)
        return out
