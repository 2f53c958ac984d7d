"""The token-history policy GRPO generates with: each episode's context is kept as token ids, so the sequence
trained on is exactly the one the model conditioned on.

The context starts as the initial prompt rendered with the prefix-preserving training template; then come every
generated completion verbatim, and the tokens the environment adds (tool results, user replies, the next
generation prompt) rendered with the same template and cut at the end-of-turn token, as TRL's own tool loop does.
Re-rendering the history each turn (what `HFPolicy` does for eval) gives the same ids whenever the model's output
is canonical (tested on reference transcripts), but a non-canonical completion (JSON spacing, a different BPE
split) would re-tokenize differently, and the policy gradient would then score tokens the model never produced.
`episode_sequence` turns the recorded turns into the trainer's sequence: `completion_ids` = everything after the
initial prompt, with `env_mask` 1 on generated tokens and 0 on environment tokens (GRPO trains on it, and
synthesize's calibration keeps it for train to replay).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from trace_cli.agents.base import as_turn
from trace_cli.config.sampling import SamplingSettings

BUDGET_ERROR = "episode token budget (max_completion_length) exhausted"


def env_suffix_text(
    tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, end_token: str
) -> str:
    """Text the environment appends after the last assistant turn: its tool results / user reply and the
    next generation prompt, starting right after that turn's end-of-turn token."""
    from trace_cli.models.chat import render

    k = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    head = render(tokenizer, messages[: k + 1], tools, add_generation_prompt=False)
    full = render(tokenizer, messages, tools, add_generation_prompt=True)
    if not full.startswith(head):
        raise RuntimeError(
            "the chat template is not prefix-preserving: the conversation's rendering does not "
            "start with the rendering of its first turns"
        )
    cut = head.rfind(end_token)
    if cut < 0:
        raise RuntimeError(f"the rendered assistant turn does not end with {end_token!r}")
    return full[cut + len(end_token) :]


@dataclass(eq=False)
class TokenPolicy:
    """Generates each turn from the episode's exact token history (see the module docstring).

    Records `{"prompt_ids", "completion_ids"[, "logprobs"]}` per turn in `EpisodeState.turns`, where
    `prompt_ids` is the full context the turn was generated from. Budget: an episode's completion (model +
    environment tokens after the initial prompt) never exceeds `budget` tokens, nor the model context; an
    episode that would is ended with termination `max_length` (its transcript gets one error turn, the
    environment is not stepped).
    """

    model: Any
    tok: Any
    max_new_tokens: int  # one turn (GRPO: the config's max_new_tokens)
    budget: int  # the episode's tokens after its first prompt (GRPO: max_completion_length)
    # sampling: the stage's config (SamplingSettings, GRPO's top_k, the stage's seed), no defaults of its own
    temperature: float
    top_p: float  # 1 = off
    top_k: int  # 0 = off
    seed: int
    max_context: int | None = None
    generate_fn: Callable[[list[list[int]], int], tuple[list[list[int]], list | None]] | None = None
    # the rollout engine (agents.engines: vllm, server); None: this process's model (`hf`)
    engine: Any = None
    reuse_cache: bool = True
    # a models.prefix_cache.PrefixCache for the current weights (clear it after each optimizer step)
    prefix_cache: Any = None
    name: ClassVar[str] = "grpo"

    def __post_init__(self):
        from trace_cli.models.chat import eos_ids

        self.max_context = self.max_context or 1 << 30
        # stop tokens: every eos id of the tokenizer and the generation config (never a literal); the turn
        # end the template writes is the tokenizer's eos
        self.end_token = self.tok.eos_token
        self.eos_ids = eos_ids(self.tok, getattr(self.model, "generation_config", None))
        if not self.end_token or not self.eos_ids:
            raise ValueError("the tokenizer has no eos token: its end-of-turn token is unknown")
        self.eos_id = self.tok.convert_tokens_to_ids(self.end_token)
        self._round = 0
        self._first: dict[str, list[int]] = {}  # first-prompt ids, shared by a group's rollouts of one seed
        self._gen_config = None

    @classmethod
    def sampling_as(cls, model: Any, tok: Any, sampling: SamplingSettings, **kw: Any) -> TokenPolicy:
        """A policy that samples as `sampling` says, its episode budget being `max_completion_length`; `kw`:
        the stage's `top_k` and `seed`, and any other field."""
        return cls(
            model,
            tok,
            max_new_tokens=sampling.max_new_tokens,
            budget=sampling.max_completion_length,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            **kw,
        )

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def context(self, state) -> list[int]:
        """The token ids the next turn of `state` is generated from."""
        from trace_cli.models.chat import render

        if not state.turns:
            key = json.dumps([state.messages, state.tools], sort_keys=True, default=str)
            if key not in self._first:
                text = render(self.tok, state.messages, state.tools, add_generation_prompt=True)
                self._first[key] = self._encode(text)
            return list(self._first[key])
        last = state.turns[-1]
        ids = last["prompt_ids"] + last["completion_ids"]
        if not last["completion_ids"] or last["completion_ids"][-1] not in self.eos_ids:
            ids = ids + [self.eos_id]  # cut at max_new_tokens: the template closes the turn (an env token)
        return ids + self._encode(env_suffix_text(self.tok, state.messages, state.tools, self.end_token))

    def act(self, states: list) -> list[Any]:
        outs: list[Any] = [None] * len(states)
        live: list[tuple[int, list[int], int]] = []
        for i, s in enumerate(states):
            ctx = self.context(s)
            used = len(ctx) - len(s.turns[0]["prompt_ids"]) if s.turns else 0
            room = min(self.max_new_tokens, self.budget - used, self.max_context - len(ctx))
            if room <= 0:
                s.done, s.termination = True, "max_length"
                outs[i] = [{"malformed": "", "error": BUDGET_ERROR}]
                continue
            live.append((i, ctx, room))
        if live:
            comps, lps = self._generate(
                [c for _, c, _ in live], max(r for _, _, r in live), [states[i] for i, _, _ in live]
            )
            for j, (i, ctx, room) in enumerate(live):
                ids = comps[j]
                for k, t in enumerate(ids):
                    if t in self.eos_ids:
                        ids = ids[: k + 1]
                        break
                ids = ids[:room]
                rec: dict[str, Any] = {"prompt_ids": ctx, "completion_ids": ids}
                if lps is not None:
                    rec["logprobs"] = list(lps[j][: len(ids)])
                states[i].turns.append(rec)
                states[i].gen_tokens += len(ids)
                outs[i] = self.tok.decode(ids, skip_special_tokens=False)
        return [as_turn(o) for o in outs]  # Hermes-parsed, as the rollout loop takes turns

    def _generate(
        self, ctxs: list[list[int]], max_new: int, states: list | None = None
    ) -> tuple[list[list[int]], list | None]:
        if self.generate_fn is not None:
            return self.generate_fn(ctxs, max_new)
        if self.engine is not None:
            from trace_cli.agents.engines import Draw

            seed = (self.seed * 1_000_003 + self._round) % (1 << 62)  # as the hf path seeds its rounds
            self._round += 1
            draw = Draw(self.temperature, self.top_p, self.top_k, seed, tuple(self.eos_ids))
            return self.engine.generate(ctxs, max_new, draw)
        import torch

        if states is not None and self.reuse_cache:
            # each episode keeps its KV cache across turns: a turn feeds only the tokens added since the last
            from trace_cli.models.kvcache import generate_reusing

            gc = self._generation_config(max_new)
            pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
            comps, caches = generate_reusing(
                self.model,
                ctxs,
                [s.kv for s in states],
                pad,
                self.eos_ids,
                prefix=self.prefix_cache,
                generation_config=gc,
            )
            for s, kv in zip(states, caches, strict=True):
                s.kv = kv
            return comps, None

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
        width = max(len(c) for c in ctxs)
        device = next(self.model.parameters()).device
        ids = torch.full((len(ctxs), width), pad, dtype=torch.long)
        att = torch.zeros((len(ctxs), width), dtype=torch.long)
        for r, c in enumerate(ctxs):
            ids[r, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            att[r, width - len(c) :] = 1
        self._generation_config(max_new)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=att.to(device), generation_config=self._gen_config
            )
        new = out[:, width:].tolist()
        return [[t for t in row] for row in new], None

    def _generation_config(self, max_new: int):
        import torch

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
        if self._gen_config is None:
            from transformers import GenerationConfig

            kw: dict[str, Any] = {
                "pad_token_id": pad,
                "eos_token_id": self.eos_ids,
                "do_sample": self.temperature > 0,
            }
            if self.temperature > 0:
                kw.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
            # as TRL builds its own: one config object, no torch.compile of the decoding loop
            self._gen_config = GenerationConfig(**kw, disable_compile=True)
        self._gen_config.max_new_tokens = max_new
        if self.temperature > 0:
            # a per-round seed: reruns (and resumed runs) reproduce, rounds, steps and ranks differ
            torch.manual_seed((self.seed * 1_000_003 + self._round) % (1 << 63))
        self._round += 1
        return self._gen_config


def episode_sequence(turns: Sequence[dict[str, Any]], eos_id: int) -> dict[str, Any]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of one episode from its per-turn records.

    Requires every turn's context to extend the previous context + completion (true by construction for
    `TokenPolicy`; for re-rendered contexts it holds only when the template is prefix-preserving and the
    re-tokenization matches, and a ValueError says when it does not)."""
    if not turns:  # ended before any generation (the prompt alone exceeded the budget)
        return {"prompt_ids": [eos_id], "completion_ids": [eos_id], "env_mask": [0], "logprobs": [0.0]}
    prompt = list(turns[0]["prompt_ids"])
    comp: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    prev = prompt
    for n, t in enumerate(turns):
        ctx = t["prompt_ids"]
        if ctx[: len(prev)] != prev:
            raise ValueError(
                f"turn {n}: its context does not extend the previous turn's context + completion"
            )
        env = ctx[len(prev) :]
        comp += env
        mask += [0] * len(env)
        lps += [0.0] * len(env)
        comp += t["completion_ids"]
        mask += [1] * len(t["completion_ids"])
        lps += list(t.get("logprobs") or [0.0] * len(t["completion_ids"]))
        prev = list(ctx) + list(t["completion_ids"])
    if not comp:
        comp, mask, lps = [eos_id], [0], [0.0]
    return {"prompt_ids": prompt, "completion_ids": comp, "env_mask": mask, "logprobs": lps}
