"""A transformers causal LM as a policy (`HFPolicy`): batched, left-padded, KV-cached generation, prompts in
the model's own chat template, turns parsed by its family's tool-call parser."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

from trace_cli.agents.base import as_turn
from trace_cli.envs.rollout import EpisodeState, Turn


@dataclass(eq=False)
class HFPolicy:
    """A transformers causal LM (optionally base + PEFT adapter): batched, left-padded, KV-cached generation.

    Prompts are rendered with the model's own template (models.chat.template_for), generation stops at every
    stop token of the tokenizer and generation config, and tool calls are parsed by the model family's parser
    (`tool_format`). In the rollout loop each episode keeps its KV cache across turns (models.kvcache), so a
    turn feeds only the tokens added since the last one; with a `prefix_cache` an episode's first turn
    starts from what earlier episodes prefilled of the same prompt. A prompt that no longer fits the model's context
    with `max_new_tokens` ends its episode (termination `max_length`) instead of being cut."""

    model: Any
    tok: Any
    _: KW_ONLY
    # sampling: the stage's SamplingSettings.policy_kwargs() and seed; sampling (temperature > 0) needs top_p and
    # seed, which `trace serve` leaves out (every request brings its own and the server samples it)
    temperature: float
    max_new_tokens: int
    top_p: float | None = None
    seed: int | None = None
    max_prompt_tokens: int | None = None
    name: str = "hf"
    record_tokens: bool = False
    tool_format: str | None = None  # the model family's tool-call parser; detected from the template if None
    max_context: int | None = None
    reuse_cache: bool = True
    # a models.prefix_cache.PrefixCache shared by all episodes (the system prompt and tools prefilled once)
    prefix_cache: Any = None
    # the rollout engine (agents.engines: vllm, server); None: `model` in this process (`hf`)
    engine: Any = None

    def __post_init__(self) -> None:
        from trace_cli.models.chat import eos_ids
        from trace_cli.models.templates import detect_tool_format

        self.tool_format = self.tool_format or detect_tool_format(getattr(self.tok, "chat_template", None))
        self.eos = eos_ids(self.tok, getattr(self.model, "generation_config", None))
        if not self.eos:
            raise ValueError("the tokenizer and generation config name no stop token (eos_token_id)")
        self._round = 0

    def parse(self, text: str) -> list[dict[str, Any]]:
        from trace_cli.models.toolcalls import parse

        return parse(text, self.tool_format, self.tok)

    def _gen_kwargs(self, temperature: float, top_p: float, max_new_tokens: int) -> dict[str, Any]:
        import torch

        do_sample = temperature > 0
        if do_sample and (top_p is None or self.seed is None):
            raise ValueError("sampling (temperature > 0) needs top_p and a seed: pass the stage's")
        kw: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "do_sample": do_sample,
            "pad_token_id": self._pad(),
            "eos_token_id": list(self.eos),
        }
        if do_sample:
            kw.update(temperature=temperature, top_p=top_p, top_k=0)
            # a per-round seed derived from the run seed: reruns reproduce, rounds differ
            torch.manual_seed(self.seed * 100_003 + self._round)
        self._round += 1
        return kw

    def _pad(self) -> int:
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos[0]

    def act(self, states: list[EpisodeState]) -> list[Turn]:
        from trace_cli.models.chat import render

        if self.engine is not None:
            return self._act_on_engine(states)
        if not self.reuse_cache:
            prompts = [render(self.tok, s.messages, s.tools, add_generation_prompt=True) for s in states]
            out = []
            for s, (text, ids, prompt_ids) in zip(states, self.generate(prompts), strict=True):
                self._account(s, prompt_ids, ids)
                out.append(as_turn(text, self.parse))
            return out
        from trace_cli.models.kvcache import generate_reusing

        outs: list[Any] = [None] * len(states)
        live: list[tuple[int, list[int]]] = []
        for i, s in enumerate(states):
            text = render(self.tok, s.messages, s.tools, add_generation_prompt=True)
            ctx = self.tok(text, add_special_tokens=False)["input_ids"]
            if self.max_context and len(ctx) + self.max_new_tokens > self.max_context:
                s.done, s.termination = True, "max_length"
                outs[i] = [{"malformed": "", "error": "the conversation no longer fits the model's context"}]
                continue
            live.append((i, ctx))
        if live:
            kw = self._gen_kwargs(self.temperature, self.top_p, self.max_new_tokens)
            comps, caches = generate_reusing(
                self.model,
                [c for _, c in live],
                [getattr(states[i], "kv", None) for i, _ in live],
                self._pad(),
                self.eos,
                prefix=self.prefix_cache,
                **kw,
            )
            for (i, ctx), ids, kv in zip(live, comps, caches, strict=True):
                states[i].kv = kv
                self._account(states[i], ctx, ids)
                outs[i] = self.tok.decode(ids, skip_special_tokens=False)
        return [as_turn(o, self.parse) for o in outs]

    def _act_on_engine(self, states: list[EpisodeState]) -> list[Turn]:
        """A turn per episode from the rollout engine: the same rendered context and stop tokens as the hf
        path, the completion cut after its first stop token."""
        from trace_cli.agents.engines import Draw
        from trace_cli.models.chat import render

        outs: list[Any] = [None] * len(states)
        live: list[tuple[int, list[int]]] = []
        for i, s in enumerate(states):
            text = render(self.tok, s.messages, s.tools, add_generation_prompt=True)
            ctx = self.tok(text, add_special_tokens=False)["input_ids"]
            if self.max_context and len(ctx) + self.max_new_tokens > self.max_context:
                s.done, s.termination = True, "max_length"
                outs[i] = [{"malformed": "", "error": "the conversation no longer fits the model's context"}]
                continue
            live.append((i, ctx))
        if live:
            sampling = self.temperature > 0
            if sampling and (self.top_p is None or self.seed is None):
                raise ValueError("sampling (temperature > 0) needs top_p and a seed: pass the stage's")
            seed = (self.seed or 0) * 100_003 + self._round  # as the hf path seeds its rounds
            self._round += 1
            draw = Draw(self.temperature, self.top_p if sampling else 1.0, 0, seed, tuple(self.eos))
            comps, _ = self.engine.generate([c for _, c in live], self.max_new_tokens, draw)
            stop = set(self.eos)
            for (i, ctx), ids in zip(live, comps, strict=True):
                ids = list(ids)[: self.max_new_tokens]
                cut = next((k + 1 for k, t in enumerate(ids) if t in stop), len(ids))
                ids = ids[:cut]
                self._account(states[i], ctx, ids)
                outs[i] = self.tok.decode(ids, skip_special_tokens=False)
        return [as_turn(o, self.parse) for o in outs]

    def _account(self, s: EpisodeState, prompt_ids: list[int], ids: list[int]) -> None:
        s.gen_tokens += len(ids)
        if len(ids) >= self.max_new_tokens and (not ids or ids[-1] not in self.eos):
            s.n_truncated += 1
        if self.record_tokens:
            s.turns.append({"prompt_ids": prompt_ids, "completion_ids": ids})

    def generate(
        self,
        prompts: list[str],
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
    ) -> list[tuple[str, list[int], list[int]]]:
        """One batched `generate` for rendered prompts: (text, completion ids, prompt ids) per prompt, the
        text cut after the first stop token. Settings default to the policy's (`trace serve` passes a
        request's own)."""
        import torch

        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        self.tok.padding_side = "left"
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        if self.max_prompt_tokens and enc["input_ids"].shape[1] > self.max_prompt_tokens:
            enc = {k: v[:, -self.max_prompt_tokens :] for k, v in enc.items()}
        # the model may live on a GPU (load_hf moves it there); the tokenizer's tensors are on the CPU
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        gen_kwargs = self._gen_kwargs(
            temperature, top_p, self.max_new_tokens if max_new_tokens is None else max_new_tokens
        )
        with torch.inference_mode():
            out = self.model.generate(**enc, **gen_kwargs)
        new = out[:, enc["input_ids"].shape[1] :]
        results = []
        stop = set(self.eos)
        for i in range(len(prompts)):
            ids = new[i].tolist()
            # Rows that stop early are padded after their stop token. A row without one ran to max_new_tokens,
            # so every one of its tokens was generated (even a pad-id token the model chose mid-turn): keep
            # all. A truncated turn is parsed as-is (an unterminated tool call is malformed).
            cut = next((k + 1 for k, t in enumerate(ids) if t in stop), len(ids))
            ids = ids[:cut]
            p = enc["input_ids"][i]
            m = enc["attention_mask"][i]
            results.append((self.tok.decode(ids, skip_special_tokens=False), ids, p[m.bool()].tolist()))
        return results
