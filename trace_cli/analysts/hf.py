"""The `hf` analyst: a local transformers causal LM (`llm.model`: store://model/NAME, a local HF dir, or a
cached hub id) with the same prompts, schemas and parsing as the `openai` analyst.

Generation uses the tokenizer's chat template (no tools), sampling at `llm.temperature` with a torch seed
derived from (seed, run, attempt), at most `llm.max_tokens` new tokens, prompts cut (in the middle, keeping
the instructions and the end of the episode) to fit `max_position_embeddings`. Episodes are generated in
batches of `llm.concurrency`. An answer that does not parse is re-generated with another seed up to
`llm.max_retries` times (not at temperature 0, where it would repeat itself); an episode whose answers all
fail gets ERROR labels — a small or untrained model yields ERROR labels, never a crash. Valid answers are
cached in the store by request digest (model content digest, messages, sampling settings, seed, run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trace_cli.analysts.cache import request_key
from trace_cli.analysts.llm_base import Answer, LLMAnalyst, llm_settings
from trace_cli.analysts.prompts import AnalystResponseError
from trace_cli.errors import UsageError
from trace_cli.progress import Bar

T = TypeVar("T")

DEFAULT_CONTEXT = 4096  # when the config has no max_position_embeddings
MIN_PROMPT_TOKENS = 256


class HFAnalyst(LLMAnalyst):
    name = "hf"

    def __init__(self, config: dict[str, Any], store: Any = None):
        from trace_cli.models.refs import resolve_model

        llm = llm_settings(config)
        if not llm.get("model"):
            raise UsageError("the hf analyst needs llm.model (a local model dir or store://model/NAME)")
        self.ref = resolve_model(str(llm["model"]), store)
        if self.ref.kind not in ("hf", "adapter"):
            raise UsageError(f"the hf analyst needs a transformers model, not {self.ref.display!r}")
        super().__init__(llm, store)
        self.max_retries = int(llm["max_retries"]) if self.temperature > 0 else 0
        self.batch_size = max(1, int(llm["concurrency"]))
        self._model = None
        self._tok = None
        self.calls = 0  # generations run (cache hits run none)

    # ------------------------------------------------------------------------------------------ model

    def _load(self):
        if self._model is None:
            from trace_cli.models.refs import load_hf

            self._model, self._tok = load_hf(self.ref)
        return self._model, self._tok

    def _budget(self, model) -> tuple[int, int]:
        """(max prompt tokens, max new tokens) within the model's context."""
        ctx = int(getattr(model.config, "max_position_embeddings", 0) or DEFAULT_CONTEXT)
        new = (
            max(1, min(self.max_tokens, ctx - MIN_PROMPT_TOKENS))
            if ctx > MIN_PROMPT_TOKENS
            else max(1, ctx // 2)
        )
        return max(1, ctx - new), new

    def _prompt_ids(self, tok, messages: list[dict[str, str]], budget: int) -> list[int]:
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
            )
            ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        else:  # a model without a chat template: plain role-prefixed turns
            text = "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant: "
            ids = tok(text, verbose=False)["input_ids"]
        if len(ids) > budget:  # keep the instructions (head) and the episode's end + answer cue (tail)
            tail = budget // 4
            ids = ids[: budget - tail] + ids[len(ids) - tail :]
        return ids

    def _generate(self, prompts: list[list[dict[str, str]]], seed: int) -> list[str | Exception]:
        """One answer text per prompt (or the exception that stopped its batch)."""
        import torch

        model, tok = self._load()
        budget, max_new = self._budget(model)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos = [
            i
            for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
            if isinstance(i, int) and i >= 0 and i != getattr(tok, "unk_token_id", None)
        ]
        out: list[str | Exception] = []
        for b in range(0, len(prompts), self.batch_size):
            batch = [self._prompt_ids(tok, m, budget) for m in prompts[b : b + self.batch_size]]
            width = max(len(x) for x in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=model.device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=model.device)
            kw: dict[str, Any] = {
                "max_new_tokens": max_new,
                "pad_token_id": pad,
                "eos_token_id": eos or None,
                "do_sample": self.temperature > 0,
            }
            if self.temperature > 0:
                kw.update(temperature=self.temperature, top_p=1.0, top_k=0)
                torch.manual_seed((seed * 1_000_003 + b) % (2**63))
            self.calls += len(batch)
            try:
                with torch.inference_mode():
                    gen = model.generate(input_ids=ids, attention_mask=mask, **kw)
            except (RuntimeError, ValueError, IndexError) as e:  # e.g. out of memory: those episodes fail
                out += [e] * len(batch)
                continue
            for row in gen[:, width:].tolist():
                cut = next((i for i, t in enumerate(row) if t in eos), len(row))
                out.append(tok.decode(row[:cut], skip_special_tokens=True))
        return out

    # ------------------------------------------------------------------------------------------ asking

    def _request(self, messages: list[dict[str, str]], run: int, seed: int) -> dict[str, Any]:
        return {
            "analyst": self.name,
            "model": self.ref.digest,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
            "run": run,
        }

    def _ask_many(
        self,
        prompts: list[list[dict[str, str]]],
        *,
        run: int,
        seed: int,
        parse: Callable[[str], T],
        what: str,
    ) -> list[tuple[T | None, str | None]]:
        """(parsed, None) or (None, reason) per prompt: cache first, then rounds of generation + parsing."""
        results: list[tuple[T | None, str | None] | None] = [None] * len(prompts)
        reqs = [self._request(m, run, seed) for m in prompts]
        keys = [request_key(r) for r in reqs]
        pending = []
        for i, k in enumerate(keys):
            hit = self.cache.get(k) if self.cache is not None else None
            if hit is not None:
                try:
                    results[i] = (parse(hit["text"]), None)
                    continue
                except AnalystResponseError:
                    pass
            pending.append(i)
        why: dict[int, str] = {}
        attempts = 0
        with Bar(len(prompts), what) as bar:
            bar.advance(len(prompts) - len(pending))
            for attempt in range(self.max_retries + 1):
                if not pending:
                    break
                attempts = attempt + 1
                texts = self._generate([prompts[i] for i in pending], seed * 7919 + run * 104_729 + attempt)
                still = []
                for i, text in zip(pending, texts, strict=True):
                    if isinstance(text, Exception):
                        why[i] = f"generation failed: {type(text).__name__}: {str(text)[:160]}"
                        still.append(i)
                        continue
                    try:
                        value = parse(text)
                    except AnalystResponseError as e:
                        why[i] = f"invalid answer: {e}"
                        still.append(i)
                        continue
                    if self.cache is not None:
                        self.cache.put(keys[i], reqs[i], text)
                    results[i] = (value, None)
                    bar.advance()
                pending = still
            for i in pending:
                results[i] = (None, f"analyst failed after {attempts} attempt(s): {why.get(i, 'no answer')}")
                bar.advance()
        return [r if r is not None else (None, "no answer") for r in results]

    # ------------------------------------------------------------------------------------------ analyst API

    def _ask_one(self, messages, *, run: int, seed: int, parse: Callable[[str], T], what: str) -> Answer:
        [answer] = self._ask_many([messages], run=run, seed=seed, parse=parse, what=what)
        return answer

    def _ask_all(self, prompts, *, run: int, seed: int, parse: Callable[[str], T], what: str) -> list[Answer]:
        return self._ask_many(prompts, run=run, seed=seed, parse=parse, what=what)
