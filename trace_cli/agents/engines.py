"""The rollout engine seam: what turns a batch of token contexts into completions for the token-level policies
(`TokenPolicy`: GRPO, calibration, validation; `HFPolicy`: eval). Three engines, chosen by a run's `rollout`
config block (train, eval and synthesize share it, so calibration, validation and eval run on the engine of the
run they belong to):

* `hf`: the policy's own transformers model in this process (the policies' built-in path: KV cache kept per
  episode across turns, a block prefix cache; `models.kvcache`). CPU, tests, small GPUs. No object here: a
  policy whose `engine` is None generates this way.
* `vllm`: vLLM in this process. In GRPO it is TRL's colocated engine (`trainer.vllm_generation`, whose weights
  TRL syncs before each rollout call: `VLLMColocated`); outside training (eval, calibration) a `vllm.LLM` of
  the model with its adapter as a LoRA request (`VLLMLocal`).
* `server`: any vLLM-compatible HTTP server (`vllm serve --enable-lora`, or `trace serve --enable-lora`):
  token ids in (`/v1/completions` with a token-id prompt), token ids and per-token log-probabilities out
  (`return_token_ids`, `logprobs`), LoRA adapters loaded and swapped with vLLM's own `/v1/load_lora_adapter` and
  `/v1/unload_lora_adapter` (`ServerEngine`); the served model name of a LoRA is its `lora_name`. The adapter
  directory must be readable by the server at the path sent (one machine, or a shared filesystem).

Every engine answers `generate(ctxs, max_new, draw) -> (completions, logprobs or None)`: one completion (token
ids, cut after the first stop token by the policy) per context, and when the engine has them the log-probability
of each sampled token under the model that sampled it (TRL's importance-sampling correction compares them).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_cli.errors import UsageError

ENGINES = ("hf", "vllm", "server")


@dataclass(frozen=True)
class Draw:
    """How one `generate` call samples: temperature 0 = greedy; top_p 1 and top_k 0 = off; `seed` is the
    round's seed (each context gets its own stream from it); `stop_ids` end a completion (the policy's eos)."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop_ids: tuple[int, ...]


class RolloutEngine(Protocol):
    name: str

    def generate(
        self, ctxs: Sequence[Sequence[int]], max_new: int, draw: Draw
    ) -> tuple[list[list[int]], list[list[float]] | None]: ...


class EngineError(RuntimeError):
    """The engine failed while a run was generating (a server that went away, a refused request)."""


# ------------------------------------------------------------------------------------------------ server


@dataclass
class ServerEngine:
    """A vLLM-compatible HTTP server as the rollout engine (`url`: its OpenAI base, e.g. http://HOST:PORT/v1).

    `model`: the served base model's name (None: the first model `/v1/models` lists, which is the base for
    vLLM and `trace serve`). `use(name)` makes a loaded LoRA (or None: the base) generate the next
    completions. Requests go one per context, `concurrency` at a time (the server batches them), each with its
    own seed, so the copies of one prompt in a GRPO group differ."""

    url: str
    model: str | None
    api_key_env: str | None
    timeout_s: float
    concurrency: int
    name: str = "server"
    active: str | None = None  # the LoRA generating now (None: the base model)
    loaded: list[str] = field(default_factory=list)  # LoRAs this engine loaded and has not unloaded
    log: list[dict[str, Any]] = field(default_factory=list)  # adapter loads/unloads: {op, name, path, s}

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")

    # -- HTTP -----------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            h["authorization"] = f"Bearer {key}"
        return h

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            raise EngineError(f"rollout server {self.url}{path}: HTTP {e.code}: {detail}") from None
        except OSError as e:
            raise EngineError(f"rollout server {self.url}{path}: {e}") from None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")  # vLLM answers the LoRA endpoints in plain text

    def check(self) -> str:
        """The served base model's name; a server that does not answer is a usage error (exit 2, before any
        compute)."""
        try:
            listed = self._call("GET", "/models", timeout=min(self.timeout_s, 10.0))
        except EngineError as e:
            raise UsageError(
                f"rollout.url {self.url!r}: no vLLM-compatible server answers there ({e})",
                hint="start one (vllm serve MODEL --enable-lora, or trace serve MODEL --enable-lora) "
                "or fix rollout.url",
            ) from None
        data = listed.get("data") if isinstance(listed, dict) else None
        names = [m.get("id") for m in data or [] if isinstance(m, dict)]
        if self.model is None:
            if not names:
                raise UsageError(f"rollout.url {self.url!r}: the server lists no model")
            self.model = names[0]
        elif self.model not in names:
            raise UsageError(
                f"rollout.model {self.model!r} is not served at {self.url} (it serves {', '.join(names)})"
            )
        return self.model

    # -- adapters -------------------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at `path` as LoRA `name` and generate with it from now on."""
        t0 = time.monotonic()
        body = {"lora_name": name, "lora_path": str(path)}
        try:
            self._call("POST", "/load_lora_adapter", body)
        except EngineError as e:  # left loaded by an interrupted run of the same name: replace it
            if "already" not in str(e):
                raise
            self._call("POST", "/unload_lora_adapter", {"lora_name": name})
            self._call("POST", "/load_lora_adapter", body)
        self.loaded.append(name)
        self.active = name
        self.log.append({"op": "load", "name": name, "path": str(path), "s": time.monotonic() - t0})

    def unload_adapter(self, name: str) -> None:
        self._call("POST", "/unload_lora_adapter", {"lora_name": name})
        if name in self.loaded:
            self.loaded.remove(name)
        if self.active == name:
            self.active = None
        self.log.append({"op": "unload", "name": name})

    def swap_adapter(self, name: str, path: str) -> None:
        """Load `name` and unload the adapters this engine loaded before it (one version served at a time)."""
        old = [n for n in self.loaded if n != name]
        self.load_adapter(name, path)
        for n in old:
            self.unload_adapter(n)

    def close(self) -> None:
        """Unload every adapter this engine loaded (the server keeps running)."""
        for n in list(self.loaded):
            try:
                self.unload_adapter(n)
            except EngineError:
                pass

    def use(self, name: str | None) -> None:
        self.active = name

    # -- generation -----------------------------------------------------------------------------------

    def served_model(self) -> str:
        return self.active or self.model or self.check()

    def request(self, ctx: Sequence[int], max_new: int, draw: Draw, seed: int | None) -> dict[str, Any]:
        """The `/v1/completions` body for one token-id context (vLLM's extra parameters included)."""
        body: dict[str, Any] = {
            "model": self.served_model(),
            "prompt": list(ctx),
            "max_tokens": int(max_new),
            "temperature": float(draw.temperature),
            "top_p": float(draw.top_p) if draw.temperature > 0 else 1.0,
            "top_k": int(draw.top_k) if draw.top_k > 0 and draw.temperature > 0 else -1,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(draw.stop_ids),
            "n": 1,
        }
        if draw.temperature > 0 and seed is not None:
            body["seed"] = int(seed)
        return body

    def generate(
        self, ctxs: Sequence[Sequence[int]], max_new: int, draw: Draw
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        bodies = [
            self.request(c, max_new, draw, (draw.seed * 9_973 + i) % (1 << 31)) for i, c in enumerate(ctxs)
        ]
        if len(bodies) == 1:
            outs = [self._call("POST", "/completions", bodies[0])]
        else:
            with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(bodies)))) as pool:
                outs = list(pool.map(lambda b: self._call("POST", "/completions", b), bodies))
        comps, lps = [], []
        for out in outs:
            ids, lp = completion_tokens(out)
            comps.append(ids)
            lps.append(lp)
        return comps, lps


def completion_tokens(body: Any) -> tuple[list[int], list[float]]:
    """(token ids, log-probabilities) of a `/v1/completions` answer with one choice: `token_ids` (vLLM's
    `return_token_ids`) or else the `token_id:N` tokens of its logprobs (`return_tokens_as_token_ids`)."""
    try:
        choice = body["choices"][0]
    except (TypeError, KeyError, IndexError):
        raise EngineError(f"rollout server: not a completion: {str(body)[:300]}") from None
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        toks = lp.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
            raise EngineError(
                "rollout server: the completion has no token ids (it needs vLLM's return_token_ids or "
                "return_tokens_as_token_ids)"
            )
        ids = [int(t.split(":", 1)[1]) for t in toks]
    logprobs = lp.get("token_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        logprobs = [float("nan")] * len(ids)
    return [int(t) for t in ids], [float("nan") if x is None else float(x) for x in logprobs]


# ------------------------------------------------------------------------------------------------ vllm


def vllm_generate(llm: Any, ctxs, max_new: int, draw: Draw, lora: Any = None):
    """One `vllm.LLM.generate` over token-id contexts with `draw`'s sampling (a seed per context)."""
    from vllm import SamplingParams, TokensPrompt

    params = [
        SamplingParams(
            max_tokens=max_new,
            temperature=draw.temperature,
            top_p=draw.top_p if draw.temperature > 0 else 1.0,
            top_k=draw.top_k if draw.top_k > 0 and draw.temperature > 0 else -1,
            seed=(draw.seed * 9_973 + i) % (1 << 31) if draw.temperature > 0 else None,
            stop_token_ids=list(draw.stop_ids),
            logprobs=0,
            skip_special_tokens=False,
        )
        for i in range(len(ctxs))
    ]
    prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in ctxs]
    outs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
    comps, lps = [], []
    for o in outs:
        c = o.outputs[0]
        comps.append(list(c.token_ids))
        steps = list(c.logprobs or [])
        lps.append(
            [
                float(steps[k][t].logprob) if k < len(steps) and t in steps[k] else float("nan")
                for k, t in enumerate(c.token_ids)
            ]
        )
    return comps, lps


@dataclass
class VLLMColocated:
    """TRL's colocated vLLM engine of a GRPO run (`trainer.vllm_generation`). Rollouts go through TRL's own
    `generate` (TRL syncs the LoRA-merged weights before each rollout call and samples with the trainer's
    settings); `direct` (validation: greedy, between two syncs) calls its `vllm.LLM` with `draw`'s sampling,
    after pushing the current weights."""

    generation: Any
    direct: bool = False
    name: str = "vllm"

    def generate(self, ctxs, max_new, draw):
        if self.direct:
            self.generation.sync_weights()
            return vllm_generate(self.generation.llm, ctxs, max_new, draw)
        _, comps, lps, _ = self.generation.generate(
            prompts=[list(c) for c in ctxs], images=None, num_generations=1
        )
        if lps is None:
            return comps, None
        return comps, [[float("nan") if x[0] is None else float(x[0]) for x in seq] for seq in lps]


@dataclass
class VLLMLocal:
    """A `vllm.LLM` of `model_path` in this process (eval, calibration outside a GRPO run); an adapter is
    served as a LoRA request. `settings`: the train schema's `vllm` block (memory, context, parallelism)."""

    model_path: str
    adapter_path: str | None
    settings: dict[str, Any]
    name: str = "vllm"

    def __post_init__(self) -> None:
        try:
            from vllm import LLM
        except ImportError:
            raise UsageError(
                "rollout.engine vllm needs vLLM installed", hint="pip install -e '.[gpu]' (a CUDA machine)"
            ) from None
        s = self.settings  # the train schema's `vllm` block, its defaults filled
        self.llm = LLM(
            model=self.model_path,
            enable_lora=self.adapter_path is not None,
            gpu_memory_utilization=s["gpu_memory_utilization"],
            max_model_len=s["max_model_len"],
            tensor_parallel_size=s["tensor_parallel_size"],
            enable_sleep_mode=s["enable_sleep_mode"],
        )
        self.lora = None
        if self.adapter_path is not None:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, self.adapter_path)

    def generate(self, ctxs, max_new, draw):
        return vllm_generate(self.llm, ctxs, max_new, draw, self.lora)


# ------------------------------------------------------------------------------------------------ choice


@dataclass(frozen=True)
class RolloutSettings:
    """A run's `rollout` config block (train, eval and synthesize schemas state its defaults)."""

    engine: str
    url: str | None
    model: str | None
    api_key_env: str | None
    timeout_s: float
    concurrency: int

    @classmethod
    def of(cls, block: Any) -> RolloutSettings:
        block = dict(block or {})
        return cls(
            engine=block["engine"],
            url=block.get("url"),
            model=block.get("model"),
            api_key_env=block.get("api_key_env"),
            timeout_s=float(block["timeout_s"]),
            concurrency=int(block["concurrency"]),
        )

    def check(self, where: str = "rollout") -> None:
        """The block's cross-field rule: a server engine needs a URL, the others none (exit 2)."""
        if self.engine == "server" and not self.url:
            raise UsageError(f"{where}.engine server needs {where}.url (e.g. http://127.0.0.1:8000/v1)")
        if self.engine != "server" and self.url:
            raise UsageError(f"{where}.url is for {where}.engine server; the engine is {self.engine}")

    def server(self) -> ServerEngine:
        return ServerEngine(
            self.url or "",
            model=self.model,
            api_key_env=self.api_key_env,
            timeout_s=self.timeout_s,
            concurrency=self.concurrency,
        )


@dataclass
class ServedModel:
    """What a policy needs of a model whose weights live in the engine, not in this process: its configs
    (context length, stop tokens). Loaded from the model directory without its weights."""

    config: Any
    generation_config: Any
    name_or_path: str

    @classmethod
    def of(cls, path: Any) -> ServedModel:
        from transformers import AutoConfig, GenerationConfig

        try:
            gen = GenerationConfig.from_pretrained(path)
        except OSError:  # no generation_config.json: the tokenizer's eos alone
            gen = None
        return cls(AutoConfig.from_pretrained(path), gen, str(path))


def open_engine(settings: RolloutSettings, ref: Any, *, vllm: Any = None) -> tuple[Any, Any, Any]:
    """(engine, model, tokenizer) to run `ref` (a models.refs.ModelRef: hf or adapter) on a non-hf engine:
    the server checked (exit 2 when it does not answer) with the adapter loaded as a LoRA named by its
    artifact id, or a local vLLM; `model` is a `ServedModel` (no weights here)."""
    from transformers import AutoTokenizer

    from trace_cli.models.refs import has_tokenizer

    if ref.kind not in ("hf", "adapter"):
        raise UsageError(
            f"rollout.engine {settings.engine}: {ref.display!r} is a {ref.kind}; an engine runs a model or an "
            "adapter (a composition runs on the hf engine)"
        )
    tok_dir = ref.adapter_path if ref.adapter_path and has_tokenizer(ref.adapter_path) else ref.path
    tok = AutoTokenizer.from_pretrained(tok_dir, padding_side="left")
    model = ServedModel.of(ref.path)
    if settings.engine == "server":
        engine = settings.server()
        engine.check()
        if ref.kind == "adapter":
            engine.load_adapter(ref.artifact_id or ref.adapter_path.name, str(ref.adapter_path))
        return engine, model, tok
    adapter = str(ref.adapter_path) if ref.kind == "adapter" else None
    if vllm is None:  # eval and synthesize have no vllm block: the train schema's defaults
        from trace_cli.config.schemas import load_schema

        block = load_schema("config/train.v1.json")["properties"]["vllm"]["properties"]
        vllm = {k: v["default"] for k, v in block.items()}
    return VLLMLocal(str(ref.path), adapter, dict(vllm)), model, tok


def id_part(block: Any) -> dict[str, Any] | None:
    """What of a `rollout` block enters an artifact id: the engine (it decides how episodes are sampled), not
    where the server listens; nothing for the default `hf` (ids of runs before the seam stay the same)."""
    engine = (block or {}).get("engine")
    return None if engine in (None, "hf") else {"engine": engine}


__all__ = [
    "ENGINES",
    "Draw",
    "EngineError",
    "RolloutEngine",
    "RolloutSettings",
    "ServedModel",
    "ServerEngine",
    "VLLMColocated",
    "VLLMLocal",
    "completion_tokens",
    "vllm_generate",
    "id_part",
    "open_engine",
]
