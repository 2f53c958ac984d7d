"""What `trace serve` runs behind HTTP: OpenAI messages -> the model's own prompt, continuous batching token by
token, and the completion parsed with the model's tool-call parser into OpenAI `tool_calls`.

One worker thread owns the model and runs a decode loop over a running batch: between two tokens it drops
the rows whose client went away, admits waiting requests (their prompts are prefilled together and their KV
cache joins the batch's, left-padded), then feeds every row its last token and samples the next. Each row
ends at a stop token, a `stop` string, `max_tokens`, or (under a forced tool call) when the call's arguments
close. Every new token is reported to the request as its text so far, so responses stream as they are made.

A prompt starts after the longest prefix of it the prefix cache holds (models.prefix_cache: keys/values of
earlier prompts and completions, by blocks of tokens), and is prefilled `prefill_chunk` tokens at a time
with a decode step of the running batch between two chunks: a long prompt holds the running streams up for
one chunk at most, and a prefill whose client went away stops at the next chunk.

With `enable_lora` (a plain model, `trace serve --enable-lora`) PEFT LoRA adapters are loaded and unloaded while it
serves (`load_adapter`/`unload_adapter`: vLLM's `/v1/load_lora_adapter` API); a request names one by its model
name. The worker thread applies the loads between decode steps; rows that share the running batch share one
adapter (the active one), so the next adapter is switched in when the batch has emptied, and the prefix cache
starts afresh with it (keys/values depend on the weights).

A router composition re-merges its weights per routing decision, so its rows only share a batch with rows
routed the same way: it routes waiting requests (on the base weights) when the batch is empty and runs one
group at a time. A gated MoE with context gates keeps a running context per row, which follows the rows as
they join and leave (compose.moe.RoutingTrace.take_rows / join_rows).
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
from collections import deque
from typing import Any

from trace_cli.models.chat import render
from trace_cli.models.prefix_cache import PrefixCache, has_sliding_layers
from trace_cli.serve.batch import Prefill, join, prefill_inputs, row_kv, select_rows
from trace_cli.serve.completion import call_prefix, json_closed
from trace_cli.serve.job import Job
from trace_cli.serve.sampling import pick, sample


class Engine:
    """A loaded HF policy (HFPolicy or a composition's policy) behind a continuous-batching decode loop."""

    def __init__(
        self,
        policy,
        name: str,
        *,
        window_s=0.0,
        max_batch=32,
        prefix_cache_mib=0.0,
        prefill_chunk=0,
        enable_lora=False,
    ):
        self.policy = policy
        self.name = name
        self.model = policy.model
        self.tok = policy.tok
        self.window_s = window_s  # kept for the CLI option: admission happens between tokens anyway
        # a sliding-window layer's cache keeps only its window, which the batch's left-padded join and trim do
        # not follow: such a model decodes one request at a time (still streamed, stopped, cancellable)
        self.sliding = has_sliding_layers(self.model.config)
        self.max_batch = 1 if self.sliding else max_batch
        self.eos_id = list(policy.eos)  # every stop token of the model (tokenizer + generation config)
        self.parse = getattr(policy, "parse", None)
        self.tool_format = getattr(policy, "tool_format", None) or "hermes"
        self.max_context: int | None = getattr(policy, "max_context", None)
        # a router composition routes each conversation on its messages (compose.policy.RouterPolicy)
        self.routes = hasattr(policy, "routes_for")
        routing = getattr(policy, "routing", None) or {}
        self._trace = routing.get("trace") if isinstance(routing, dict) else None
        # keys/values depend on the tokens alone, unless a router re-merges weights or context gates keep state
        exact = not (self.routes or self._trace is not None or self.sliding)
        self.prefix = PrefixCache(int(prefix_cache_mib * 2**20)) if exact and prefix_cache_mib > 0 else None
        # LoRA adapters loaded at run time (a plain model only: a composition's weights are its own)
        self.enable_lora = bool(enable_lora) and not self.routes and self._trace is None
        self.loras: dict[str, str] = {}  # served name -> adapter directory
        self._active: str | None = None  # the adapter the running batch generates with (None: the base)
        self._dead: set[str] = set()  # unloaded, still in the model until no row uses them
        self._controls: queue.Queue = queue.Queue()
        self.adapter_loads = 0
        self.adapter_switches = 0
        # a prompt is prefilled `prefill_chunk` tokens at a time, a decode step of the running batch between
        # two chunks (0: in one pass); a gate context or a sliding window is not followed across chunks
        self.chunk = prefill_chunk if self._trace is None and not self.sliding else 0
        self._pending: Prefill | None = None
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._waiting: list[Job] = []
        self._prefilling = 0
        self._rows: list[Job] = []
        self._cache = None
        self._mask = None  # (B, L) 1 for real tokens of the running batch's cache
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.batches: deque[int] = deque(maxlen=100_000)  # running batch size at recent decode steps
        self.max_running = 0
        self.tokens = 0  # generated so far
        self.steps = 0
        self.prefill_tokens = 0  # prompt tokens run through the model (not served from the prefix cache)
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.chunks = 0  # prefill passes
        self.steps_in_prefill = 0  # decode steps run between two chunks of a prefill
        self.prefills_cancelled = 0  # prefills stopped between chunks: their clients went away

    # -- the request side (event loop) ---------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return render(self.tok, messages, tools, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def forced_ids(self, prompt: str, prompt_ids: list[int], names: list[str]) -> list[list[int]]:
        """Per tool name, the tokens a call to it starts with after `prompt` (tokenized with the prompt, so
        they are the tokens the model would have produced)."""
        out = []
        template = getattr(self.tok, "chat_template", None)
        template = template if isinstance(template, str) else None
        for n in names:
            full = self.encode(prompt + call_prefix(self.tool_format, n, template))
            k = 0
            while k < min(len(full), len(prompt_ids)) and full[k] == prompt_ids[k]:
                k += 1
            seq = (
                full[k:] if k == len(prompt_ids) else self.encode(call_prefix(self.tool_format, n, template))
            )
            out.append(seq)
        return out

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="generate", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)  # type: ignore[arg-type]  # wake the worker
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)

    def stats(self) -> dict[str, int]:
        """What the decode loop is doing now and has done (rows running, requests waiting, decode steps,
        tokens generated, prompt tokens prefilled and served from the prefix cache)."""
        return {
            "running": len(self._rows) + self._prefilling,
            "waiting": len(self._waiting) + self._inbox.qsize(),
            "steps": self.steps,
            "tokens": self.tokens,
            "max_running": self.max_running,
            "prefill_tokens": self.prefill_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_chunks": self.chunks,
            "steps_in_prefill": self.steps_in_prefill,
            "prefills_cancelled": self.prefills_cancelled,
            "prefix_cache_bytes": self.prefix.bytes if self.prefix else 0,
        }

    def adapter_for(self, model: str) -> str | None:
        """The LoRA a request for `model` generates with (None: the base model); an unknown name is HTTP 404."""
        from trace_cli.serve.requests import RequestError

        if model == self.name:
            return None
        if model in self.loras:
            return model
        served = ", ".join([self.name, *self.loras])
        raise RequestError(
            f"model {model!r} is not served here; this server serves {served}",
            param="model",
            code="model_not_found",
            status=404,
        )

    async def control(self, op: str, name: str, path: str | None = None) -> None:
        """Load (`op` load, from `path`) or unload a LoRA adapter; done by the worker thread between two
        decode steps. Errors are RequestErrors (HTTP 400, or 404 for an unknown adapter)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(err: Exception | None) -> None:
            def put() -> None:
                if fut.done():
                    return
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)

            loop.call_soon_threadsafe(put)

        self._controls.put((op, name, path, done))
        self._inbox.put(None)  # type: ignore[arg-type]  # wake the worker
        await fut

    def submit(self, job: Job) -> Job:
        assert self._thread is not None, "Engine.start() first"
        self._inbox.put(job)
        return job

    async def generate(
        self,
        prompt: str,
        key: tuple,
        messages: list[dict[str, Any]] | None = None,
    ) -> tuple[str, list[int], list[int], dict[str, float] | None]:
        """(text, completion ids, prompt ids, routing decision or None) for one rendered prompt, as
        HFPolicy.generate gives it (`key`: temperature, top_p, max_tokens)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        route: list[Any] = [None]

        def emit(ev: tuple) -> None:
            def put() -> None:
                if ev[0] == "start":
                    route[0] = ev[1]
                elif ev[0] == "done" and not fut.done():
                    fut.set_result(ev)
                elif ev[0] == "error" and not fut.done():
                    fut.set_exception(ev[1])

            loop.call_soon_threadsafe(put)

        temperature, top_p, max_tokens = key
        ids = self.encode(prompt)
        job = self.submit(Job(ids, max_tokens, emit, temperature, top_p, messages=messages))
        try:
            _, text, comp, _ = await fut
        except asyncio.CancelledError:
            job.cancel()
            raise
        return text, comp, ids, route[0]

    # -- the worker thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while not self._stopping.is_set():
                try:
                    self._run_controls()
                    self._admit(block=not self._rows and self._pending is None)
                    if self._pending is not None:
                        self._prefill_step()
                    if self._rows:
                        self._step()
                except Exception as e:  # noqa: BLE001 - every running request gets the error (HTTP 500)
                    for j in self._rows + self._waiting:
                        j.emit(("error", e))
                    self._rows, self._waiting, self._cache, self._mask = [], [], None, None

    def _pull(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=0.2) if block and not self._waiting else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if job is not None:
                self._waiting.append(job)
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, block: bool) -> None:
        if any(j.cancelled for j in self._rows):
            self._keep([i for i, j in enumerate(self._rows) if not j.cancelled])
        self._pull(block)
        self._waiting = [j for j in self._waiting if not j.cancelled]
        if not self._waiting or self._stopping.is_set() or self._pending is not None:
            return
        if self.routes:
            if self._rows:
                return  # routing needs the base weights: wait until this group is done
            fresh = [j for j in self._waiting if j.key is None]
            if fresh:
                for j, (key, route) in zip(
                    fresh, self.policy.routes_for([j.messages or [] for j in fresh]), strict=True
                ):
                    j.key, j.route = key, route
            key = self._waiting[0].key
            group = [j for j in self._waiting if j.key == key][: self.max_batch]
            self.policy.use_route(key)
        elif self.enable_lora:
            for j in [j for j in self._waiting if j.adapter is not None and j.adapter not in self.loras]:
                j.emit(("error", self._gone(j.adapter)))  # unloaded while it waited
            self._waiting = [j for j in self._waiting if j.adapter is None or j.adapter in self.loras]
            if not self._waiting:
                return
            key = self._rows[0].adapter if self._rows else self._waiting[0].adapter
            if not self._rows:
                self._activate(key)
            same = [j for j in self._waiting if j.adapter == key]
            group = same[: max(0, self.max_batch - len(self._rows))]
        else:
            group = self._waiting[: max(0, self.max_batch - len(self._rows))]
        if not group:
            return
        taken = {id(j) for j in group}
        self._waiting = [j for j in self._waiting if id(j) not in taken]
        # counted as running from their first chunk on (the prefill may take a while): /stats never shows a
        # request that has started streaming as neither waiting nor running
        self._prefilling = len(group)
        for j in group:
            j.emit(("start", j.route))
        try:
            self._pending = self._prefill_inputs(group)
        except Exception as e:  # noqa: BLE001 - these requests fail (HTTP 500); the running batch goes on
            self._fail_prefill(group, e)

    # -- LoRA adapters (worker thread) ---------------------------------------------------------------

    @staticmethod
    def _gone(name: str) -> Exception:
        from trace_cli.serve.requests import RequestError

        return RequestError(f"The lora adapter '{name}' cannot be found.", param="model", status=404)

    def _run_controls(self) -> None:
        while True:
            try:
                op, name, path, done = self._controls.get_nowait()
            except queue.Empty:
                return
            try:
                self._load(name, path) if op == "load" else self._unload(name)
            except Exception as e:  # noqa: BLE001 - the request that asked gets it (HTTP 400/404)
                done(e)
            else:
                done(None)

    def _load(self, name: str, path: str) -> None:
        from peft import PeftModel

        from trace_cli.serve.requests import RequestError

        if not self.enable_lora:
            raise RequestError(
                "LoRA adapters are not enabled on this server: start it with --enable-lora", status=400
            )
        if name == self.name or name in self.loras:
            raise RequestError(f"The lora adapter '{name}' has already been loaded.", status=400)
        try:
            if name in self._dead:  # unloaded, not yet dropped: drop it now (it is not the active one)
                self.model.delete_adapter(name)
                self._dead.discard(name)
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
                self.policy.model = self.model
        except Exception as e:  # noqa: BLE001 - a path that holds no adapter of this model is the caller's
            raise RequestError(f"Loading lora adapter '{name}' from {path} failed: {e}", status=400) from e
        self.model.eval()
        self._apply_active()  # loading never changes what the running batch generates with
        self.loras[name] = path
        self.adapter_loads += 1

    def _unload(self, name: str) -> None:
        if name not in self.loras:
            raise self._gone(name)
        del self.loras[name]
        self._dead.add(name)
        self._sweep()

    def _activate(self, key: str | None) -> None:
        """Make `key` (a LoRA, or None: the base) what the next batch generates with."""
        if key == self._active:
            return
        self._active = key
        self._apply_active()
        self.adapter_switches += 1
        if self.prefix is not None:  # keys/values of other weights
            self.prefix = PrefixCache(self.prefix.max_bytes, self.prefix.block)
        self._sweep()

    def _apply_active(self) -> None:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            return
        if self._active is None:
            self.model.base_model.disable_adapter_layers()
        else:
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(self._active)

    def _sweep(self) -> None:
        """Drop unloaded adapters from the model once nothing generates with them."""
        for n in list(self._dead):
            busy = n == self._active or any(j.adapter == n for j in self._rows)
            if not busy and len(getattr(self.model, "peft_config", {})) > 1:
                self.model.delete_adapter(n)
                self._dead.discard(n)
                self._apply_active()

    def _fail_prefill(self, group: list[Job], e: Exception) -> None:
        for j in group:
            j.emit(("error", e))
        self._pending, self._prefilling = None, 0

    def _device(self):
        return next(self.model.parameters()).device

    def _prefill_inputs(self, group: list[Job]) -> Prefill:
        """The new rows' inputs, each after the longest prefix of its prompt the prefix cache holds (all but
        its last token at most: that one's logits are needed)."""
        hits = [
            self.prefix.match(j.prompt_ids, len(j.prompt_ids) - 1) if self.prefix else (0, None)
            for j in group
        ]
        for j, (n, _) in zip(group, hits, strict=True):
            j.cached = n
        pre = prefill_inputs(
            [j.prompt_ids for j in group], hits, self.policy._pad(), self.model.config, self._device()
        )
        pre.group = group
        return pre

    def _prefill_step(self) -> None:
        """One chunk of the pending prefill (all of it without chunking); the last one joins its rows to the
        running batch. A prefill whose requests are all gone stops here, between two chunks."""
        pre = self._pending
        if all(j.cancelled for j in pre.group):
            self._pending, self._prefilling = None, 0
            self.prefills_cancelled += 1
            return
        a = pre.fed
        b = pre.width if not self.chunk else min(pre.width, a + self.chunk)
        saved = self._trace.take_rows() if self._trace is not None else None
        try:
            out = self.model(
                input_ids=pre.ids[:, a:b],
                attention_mask=pre.mask[:, : pre.wc + b],
                position_ids=pre.pos[:, a:b],
                past_key_values=pre.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        except Exception as e:  # noqa: BLE001 - these requests fail (HTTP 500); the running batch goes on
            if self._trace is not None:
                self._trace.take_rows()
                self._trace.state = dict(saved or {})  # the running rows keep their gate context
            self._fail_prefill(pre.group, e)
            return
        pre.fed, pre.cache = b, out.past_key_values
        self.chunks += 1
        self.prefill_tokens += int(pre.mask[:, pre.wc + a : pre.wc + b].sum())
        if b == pre.width:
            self._pending, self._prefilling = None, 0
            self._joined(pre, out.logits[:, -1], saved)

    def _joined(self, pre: Prefill, logits, saved) -> None:
        """The prefilled rows join the running batch (their prompts enter the prefix cache) and get their
        first token."""
        import torch

        group, cache, mask = pre.group, pre.cache, pre.mask
        for r, j in enumerate(group):
            self.cached_tokens += j.cached
            if self.prefix is not None:
                self.prefix.insert(j.prompt_ids, row_kv(cache, mask, r, j.cached), j.cached)
        if self._rows:
            self._cache, self._mask = join(self._cache, self._mask, cache, mask)
            if self._trace is not None:
                self._trace.join_rows(saved)
        else:
            self._cache, self._mask = cache, mask
        self._rows = self._rows + group
        self.max_running = max(self.max_running, len(self._rows))
        dev = self._device()
        for j in group:
            j.ids, j.text = [], ""
            if j.temperature > 0:
                j._gen = torch.Generator(device=dev)
                j._gen.manual_seed(j.seed if j.seed is not None else random.getrandbits(62))
        self._advance(group, logits)

    def _step(self) -> None:
        import torch

        dev = self._device()
        last = torch.tensor([[j.ids[-1]] for j in self._rows], dtype=torch.long, device=dev)
        pos = self._mask.sum(-1, keepdim=True)
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self._rows), 1))], -1)
        out = self.model(
            input_ids=last,
            attention_mask=self._mask,
            position_ids=pos,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._cache = out.past_key_values
        self.batches.append(len(self._rows))
        self.steps += 1
        self.steps_in_prefill += self._pending is not None
        self._advance(self._rows, out.logits[:, -1])

    def _advance(self, rows: list[Job], logits) -> None:
        """Choose each row's next token, report its text, and drop the rows that are done."""
        import torch

        greedy = logits.argmax(-1).tolist()
        eos = set(self.eos_id)
        logps = logits.float().log_softmax(-1) if any(j.want_logprobs for j in rows) else None
        for r, j in enumerate(rows):
            k = len(j.ids)
            tok = greedy[r]
            nxt: list[int] = []
            if j.forced and not j._forced_done:
                # the call's start: the token every candidate left agrees on, else the model's pick among them
                live = [c for c in j.forced if len(c) > k and c[:k] == j.ids]
                nxt = sorted({c[k] for c in live})
                if len(nxt) == 1:
                    tok = nxt[0]
                elif nxt:
                    row = logits[r, nxt]
                    tok = nxt[pick(row, j) if j.temperature > 0 else int(row.argmax())]
                if not nxt or all(len(c) == k + 1 for c in live if c[k] == tok):
                    j._forced_done = True  # the model writes the rest (the arguments)
                    j.close_json = self._closes_json()
                    j._forced_len = k + 1 if nxt else k
            if not nxt and j.temperature > 0:
                tok = sample(logits[r], j, torch)
            j.ids.append(tok)
            if j.want_logprobs:
                j.logprobs.append(float(logps[r, tok]))
            self.tokens += 1
            if tok in eos or tok in j.stop_ids:
                j.finish = "stop"
            else:
                j.text = self.tok.decode(j.ids, skip_special_tokens=False)
                if j.stop:
                    self._cut_stop(j)
                if j.finish is None and j.close_json and k + 1 > j._forced_len and json_closed(j.text):
                    j.finish = "tool_calls"
            if j.finish is None and len(j.ids) >= j.max_tokens:
                j.finish = "length"
            if j.finish is None:
                j.emit(("text", j.text, len(j.ids)))
        done = [j for j in rows if j.finish is not None]
        if done:
            self._remember(done)
            gone = {id(j) for j in done}
            self._keep([i for i, j in enumerate(self._rows) if id(j) not in gone])  # before a client hears
            for j in done:
                text = (
                    j.text
                    if j.finish != "stop" or j.ids[-1] not in eos
                    else self.tok.decode(j.ids, skip_special_tokens=False)
                )
                j.emit(("done", text, list(j.ids), j.finish))

    def _remember(self, done: list[Job]) -> None:
        """Finished rows' prompts and completions enter the prefix cache (a conversation's next turn starts
        with them)."""
        if self.prefix is None:
            return
        for j in done:
            r = next(i for i, x in enumerate(self._rows) if x is j)
            start = len(j.prompt_ids) // self.prefix.block * self.prefix.block
            self.prefix.insert(j.prompt_ids + j.ids, row_kv(self._cache, self._mask, r, start), start)

    def _closes_json(self) -> bool:
        return self.tool_format in ("hermes", "llama3-json", "mistral")

    @staticmethod
    def _cut_stop(j: Job) -> None:
        hits = [j.text.find(s) for s in j.stop if s and s in j.text]
        if hits:
            j.text, j.finish = j.text[: min(hits)], "stop"

    def _keep(self, keep: list[int]) -> None:
        """Keep only rows `keep` of the running batch (cache, mask, gate context), trimming all-pad columns."""
        if len(keep) == len(self._rows):
            return
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            if self._trace is not None:
                self._trace.take_rows()
            return
        self._mask, idx = select_rows(self._cache, self._mask, keep)
        if self._trace is not None:
            self._trace.select_rows(idx)
