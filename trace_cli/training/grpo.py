"""GRPO + LoRA on TRL's `GRPOTrainer`, driving our environments through a `rollout_func` (the only module importing trl).

Why `rollout_func`, not `environment_factory` (read in trl 1.16 `grpo_trainer.py`):
  * TRL's environment loop (`_tool_call_loop`) ends an episode at the first assistant turn without a parsable
    tool call. Our environments talk back: a message to the user is answered by the user simulator and the
    episode goes on, malformed calls get a tool error (τ²-bench style), and episodes end on the env's own
    terms (done, max_turns, too many errors). Only a white-box rollout can drive that.
  * `environment_factory` exposes an env's *class* methods as tools (with docstrings/type hints); our tools
    are JSON schemas that differ per environment artifact, and the reward is `env.verify()`.
  * With `rollout_func`, training and `trace eval` share one episode implementation:
    `trace_cli.envs.rollout.rollout` (action parsing, env stepping, user simulator, termination, verify).

Seeds: TRL hands `rollout_func` only the prompts (already repeated `num_generations` times by its
`RepeatSampler`), not the dataset rows. Each dataset row is one seed, and its `prompt` is the marker
`trace-seed:<seed>` (the `seed` column is kept for logging); `rollout_func` parses the marker back. Mapping
rendered prompt text -> seed instead would break when two seeds render the same opening, and would render
every prompt twice. The `num_generations` copies of a seed are one GRPO group, so advantages are normalised
within same-seed groups, as the paper does.

Tokens: the sequence we train on is exactly the one the model conditioned on. `TokenPolicy` keeps each
episode's context as token ids: the initial prompt rendered with the prefix-preserving training template,
then every generated completion verbatim, then the tokens the environment adds (tool results, user
replies, the next generation prompt) rendered with the same template and cut at the end-of-turn token, as
TRL's own tool loop does. `completion_ids` = everything after the initial prompt, with `env_mask` 1 on
generated tokens and 0 on environment tokens. Re-rendering the history each turn (what `HFPolicy` does for
eval) gives the same ids whenever the model's output is canonical (tested on reference transcripts), but a
non-canonical completion (JSON spacing, a different BPE split) would re-tokenize differently, and the policy
gradient would then score tokens the model never produced.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED_PREFIX = "trace-seed:"
CHECKPOINT_PREFIX = "checkpoint-"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
BUDGET_ERROR = "episode token budget (max_completion_length) exhausted"


# ---------------------------------------------------------------------------------------------- processes
def world_size() -> int:
    """Processes of this run as the launcher set them (1 when not launched by accelerate/torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def process_rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Rank 0, read from the launcher's environment (cheap: no torch.distributed needed)."""
    return process_rank() == 0


# ---------------------------------------------------------------------------------------------- seeds
def seed_prompt(seed: int) -> str:
    return f"{SEED_PREFIX}{int(seed)}"


def parse_seed(prompt: Any) -> int:
    if isinstance(prompt, str) and prompt.startswith(SEED_PREFIX):
        return int(prompt[len(SEED_PREFIX) :])
    raise ValueError(f"not a trace seed prompt: {prompt!r} (expected {SEED_PREFIX}<int>)")


# ---------------------------------------------------------------------------------------------- policy
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


class TokenPolicy:
    """Generates each turn from the episode's exact token history (see the module docstring).

    Records `{"prompt_ids", "completion_ids"[, "logprobs"]}` per turn in `EpisodeState.turns`, where
    `prompt_ids` is the full context the turn was generated from. Budget: an episode's completion (model +
    environment tokens after the initial prompt) never exceeds `budget` tokens, nor the model context; an
    episode that would is ended with termination `max_length` (its transcript gets one error turn, the
    environment is not stepped).
    """

    name = "grpo"

    def __init__(
        self,
        model,
        tokenizer,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 160,
        budget: int = 1024,
        max_context: int | None = None,
        seed: int = 0,
        generate_fn: Callable[[list[list[int]], int], tuple[list[list[int]], list | None]] | None = None,
        reuse_cache: bool = True,
    ):
        self.model = model
        self.tok = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_new_tokens = max_new_tokens
        self.budget = budget
        self.max_context = max_context or 1 << 30
        self.seed = seed
        self.generate_fn = generate_fn
        self.reuse_cache = reuse_cache
        from trace_cli.models.chat import eos_ids

        # stop tokens: every eos id of the tokenizer and the generation config (never a literal); the turn
        # end the template writes is the tokenizer's eos
        self.end_token = tokenizer.eos_token
        self.eos_ids = eos_ids(tokenizer, getattr(model, "generation_config", None))
        if not self.end_token or not self.eos_ids:
            raise ValueError("the tokenizer has no eos token: its end-of-turn token is unknown")
        self.eos_id = tokenizer.convert_tokens_to_ids(self.end_token)
        self._round = 0
        self._first: dict[str, list[int]] = {}  # first-prompt ids, shared by a group's rollouts of one seed
        self._gen_config = None

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
        return outs

    def _generate(
        self, ctxs: list[list[int]], max_new: int, states: list | None = None
    ) -> tuple[list[list[int]], list | None]:
        if self.generate_fn is not None:
            return self.generate_fn(ctxs, max_new)
        import torch

        if states is not None and self.reuse_cache:
            # each episode keeps its KV cache across turns: a turn feeds only the tokens added since the last
            from trace_cli.models.kvcache import generate_reusing

            gc = self._generation_config(max_new)
            pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
            comps, caches = generate_reusing(
                self.model, ctxs, [s.kv for s in states], pad, self.eos_ids, generation_config=gc
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


# ---------------------------------------------------------------------------------------------- sequences
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


# ---------------------------------------------------------------------------------------------- spec
@dataclass
class GRPOSpec:
    """Everything one GRPO run needs, resolved by the stage (no store or click objects)."""

    model_path: str
    make_env: Callable[[], Any]
    seeds: list[int]
    output_dir: str  # checkpoints go here (checkpoint-N/)
    num_generations: int = 16
    per_device_batch_size: int = 16
    gradient_accumulation_steps: int = 4
    max_steps: int = 20
    learning_rate: float = 1e-5
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    drop_constant_groups: bool = True
    max_turns: int = 12
    max_new_tokens: int = 160
    max_completion_length: int = 1024
    rollout_batch_size: int = 64
    lora: dict[str, Any] = field(
        default_factory=lambda: {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    )
    checkpoint_every: int = 5
    precision: str = "auto"
    gradient_checkpointing: bool | None = None
    use_vllm: bool = False
    vllm: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    resume_from: str | None = None
    log: Callable[[dict[str, Any]], None] | None = None
    keep_model: bool = False  # return the trained PeftModel (tests inspect its parameters)


@dataclass
class GRPOResult:
    adapter_dir: Path  # PEFT adapter files (rank 0 only; other ranks get the same path, possibly empty)
    log_history: list[dict[str, Any]]
    global_step: int
    train_runtime_s: float
    trainable_parameters: int
    total_parameters: int
    resumed_from_step: int | None
    model: Any = None
    train_cpu_s: float = 0.0  # process CPU time of trainer.train() (robust to other load on the machine)


def episodes_per_generation(spec: GRPOSpec, world: int) -> int:
    """Episodes in one generation batch, all ranks together (= completions per optimizer step)."""
    return spec.per_device_batch_size * world * spec.gradient_accumulation_steps


def rollouts_after(spec: GRPOSpec, world: int, steps: int) -> int:
    """Episodes generated to reach optimizer step `steps`: one generation batch every `num_iterations`
    steps (TRL reuses a batch for num_iterations optimizer steps)."""
    return math.ceil(steps / spec.num_iterations) * episodes_per_generation(spec, world)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint (the Trainer writes trainer_state.json last)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    done = [
        p
        for p in d.iterdir()
        if p.is_dir()
        and p.name.startswith(CHECKPOINT_PREFIX)
        and p.name[len(CHECKPOINT_PREFIX) :].isdigit()
        and (p / "trainer_state.json").is_file()
    ]
    return max(done, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]), default=None)


def checkpoint_step(path: str | Path) -> int:
    return int(Path(path).name[len(CHECKPOINT_PREFIX) :])


# ---------------------------------------------------------------------------------------------- trainer
def _trainer_class():
    """GRPOTrainer + dropping constant-reward groups from the loss (DESIGN §2: "groups with constant reward
    dropped"). TRL gives such groups zero advantage; we also take their tokens out of the loss normaliser so
    they do not dilute the groups that carry signal."""
    import torch
    from trl import GRPOTrainer

    class TraceGRPOTrainer(GRPOTrainer):
        drop_constant_groups = True
        _last_rewards: list[float] | None = None

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if not self.drop_constant_groups or self._last_rewards is None or not self.model.training:
                return out
            device = out["advantages"].device
            local = torch.tensor(self._last_rewards, dtype=torch.float32, device=device)
            self._last_rewards = None
            rewards = self.accelerator.gather(local).view(-1, self.num_generations)
            const = (rewards.max(dim=1).values == rewards.min(dim=1).values).repeat_interleave(
                self.num_generations
            )
            n = len(local)
            mine = const[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n]
            keep = (~mine).long().unsqueeze(1)
            mask = out.get("tool_mask")
            if mask is None:
                mask = torch.ones_like(out["completion_mask"])
            out["tool_mask"] = mask * keep
            items = self.accelerator.gather((out["completion_mask"] * out["tool_mask"]).sum()).sum()
            out["num_items_in_batch"] = items.clamp(min=1)
            return out

    return TraceGRPOTrainer


def _vllm_generate(trainer):
    """Generation through TRL's colocated vLLM engine (GPU; weights are synced by TRL before rollout_func)."""

    def gen(ctxs: list[list[int]], max_new: int):
        _, comps, lps, _ = trainer.vllm_generation.generate(prompts=ctxs, images=None, num_generations=1)
        lps = (
            [[float("nan") if x[0] is None else x[0] for x in seq] for seq in lps]
            if lps is not None
            else None
        )
        return comps, lps

    return gen


def make_rollout_func(spec: GRPOSpec, tokenizer, max_context: int, state: dict[str, Any]):
    """TRL `rollout_func(prompts, trainer)`: one episode of our shared rollout loop per prompt entry."""
    from trace_cli.envs.rollout import rollout

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        from trl.models.utils import unwrap_model_for_generation

        seeds = [parse_seed(p) for p in prompts]
        rank = trainer.accelerator.process_index
        run_seed = (
            (spec.seed * 7_919 + trainer.state.global_step) * 131 + rank * 17 + state.setdefault("calls", 0)
        )
        state["calls"] += 1
        t0 = time.monotonic()
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model:
            policy = TokenPolicy(
                model,
                tokenizer,
                temperature=spec.temperature,
                top_p=spec.top_p,
                top_k=spec.top_k,
                max_new_tokens=spec.max_new_tokens,
                budget=spec.max_completion_length,
                max_context=max_context,
                seed=run_seed,
                generate_fn=_vllm_generate(trainer) if spec.use_vllm else None,
            )
            jobs = [(s, i) for i, s in enumerate(seeds)]
            results = rollout(
                policy, spec.make_env, jobs, max_turns=spec.max_turns, batch_size=spec.rollout_batch_size
            )
        seqs = [episode_sequence(r.turns, policy.eos_id) for r in results]
        state["rollout_s"] = state.get("rollout_s", 0.0) + time.monotonic() - t0
        state["episodes"] = state.get("episodes", 0) + len(results)
        state["gen_tokens"] = state.get("gen_tokens", 0) + sum(r.gen_tokens for r in results)
        return {
            "prompt_ids": [s["prompt_ids"] for s in seqs],
            "completion_ids": [s["completion_ids"] for s in seqs],
            "env_mask": [s["env_mask"] for s in seqs],
            "logprobs": [s["logprobs"] for s in seqs] if spec.use_vllm else None,
            "env_reward": [r.reward for r in results],
            "env_success": [float(r.success) for r in results],
            "env_turns": [float(r.n_actions) for r in results],
            "env_max_length": [float(r.termination == "max_length") for r in results],
        }

    return rollout_func


def make_reward_func(holder: dict[str, Any]):
    """The environment's graded final reward (`env.verify()`), passed through from rollout_func."""

    def env_reward(
        prompts=None,
        completions=None,
        env_reward=None,
        env_success=None,
        env_turns=None,
        env_max_length=None,
        log_metric=None,
        **kwargs,
    ) -> list[float]:
        rewards = [float(r) for r in env_reward]
        trainer = holder.get("trainer")
        if trainer is not None:
            trainer._last_rewards = rewards
        if log_metric is not None:
            for name, vals in (
                ("success", env_success),
                ("turns", env_turns),
                ("max_length_frac", env_max_length),
            ):
                if vals:
                    log_metric(name, sum(vals) / len(vals))
        return rewards

    return env_reward


def train_grpo(spec: GRPOSpec) -> GRPOResult:
    """Build the model, LoRA, dataset and trainer; train (or resume); save the adapter under output_dir/final."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig

    warnings.filterwarnings(
        "ignore", message=r".*(gradient_checkpointing|is_gradient_checkpointing).*deprecated"
    )
    if os.environ.get("TRACE_NO_PROGRESS") or not sys.stderr.isatty():
        hf_logging.disable_progress_bar()

    cuda = torch.cuda.is_available()
    bf16 = spec.precision == "bf16" or (spec.precision == "auto" and cuda and torch.cuda.is_bf16_supported())
    dtype = torch.bfloat16 if bf16 and cuda else torch.float32
    tok = AutoTokenizer.from_pretrained(spec.model_path, padding_side="left", truncation_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=dtype)
    max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
    ckpt = spec.checkpoint_every
    vllm = spec.vllm or {}
    args = GRPOConfig(
        output_dir=spec.output_dir,
        max_steps=spec.max_steps,
        per_device_train_batch_size=spec.per_device_batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        num_generations=spec.num_generations,
        num_iterations=spec.num_iterations,
        learning_rate=spec.learning_rate,
        lr_scheduler_type=spec.lr_scheduler,
        warmup_steps=spec.warmup_steps,
        max_grad_norm=spec.max_grad_norm,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        beta=spec.beta,
        epsilon=spec.epsilon,
        epsilon_high=spec.epsilon_high,
        loss_type=spec.loss_type,
        scale_rewards=spec.scale_rewards,
        max_completion_length=spec.max_completion_length,
        logging_steps=1,
        save_strategy="steps" if ckpt else "no",
        save_steps=ckpt or 500,
        save_total_limit=2,
        report_to="none",
        use_cpu=not cuda,
        bf16=bf16,
        gradient_checkpointing=bool(
            cuda if spec.gradient_checkpointing is None else spec.gradient_checkpointing
        ),
        seed=spec.seed,
        disable_tqdm=bool(os.environ.get("TRACE_NO_PROGRESS")),
        remove_unused_columns=False,
        use_vllm=spec.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=vllm.get("gpu_memory_utilization", 0.3),
        generation_kwargs={"max_tokens": spec.max_new_tokens} if spec.use_vllm else None,
        log_level="warning",
    )
    lora = spec.lora
    peft_config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["target_modules"],
        task_type="CAUSAL_LM",
    )
    dataset = Dataset.from_dict({"prompt": [seed_prompt(s) for s in spec.seeds], "seed": list(spec.seeds)})
    holder: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    callbacks = []
    if spec.log is not None:
        log_fn = spec.log

        class _Log(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "reward" in logs:
                    log_fn({"step": state.global_step, **logs})

        callbacks.append(_Log())
    cls = _trainer_class()
    trainer = cls(
        model=model,
        reward_funcs=[make_reward_func(holder)],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=peft_config,
        rollout_func=make_rollout_func(spec, tok, max_context, stats),
        callbacks=callbacks,
    )
    trainer.drop_constant_groups = spec.drop_constant_groups
    # the Trainer's printer/progress callbacks write every log dict to stdout (tqdm.write); stdout is for
    # results (`--json`), and the stage prints one line per step to stderr instead
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    holder["trainer"] = trainer
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    trainable = sum(p.numel() for p in unwrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in unwrapped.parameters())
    cpu0 = time.process_time()
    out = trainer.train(resume_from_checkpoint=spec.resume_from)
    cpu_s = time.process_time() - cpu0
    final = Path(spec.output_dir) / "final"
    trainer.save_model(str(final))  # every rank calls it (sharded setups gather); rank 0 writes
    trainer.accelerator.wait_for_everyone()
    history = list(trainer.state.log_history)
    step = trainer.state.global_step
    runtime = float(out.metrics.get("train_runtime", 0.0)) if out is not None else 0.0
    kept = unwrapped if spec.keep_model else None
    del trainer, model, unwrapped
    return GRPOResult(
        final,
        history,
        step,
        runtime,
        trainable,
        total,
        checkpoint_step(spec.resume_from) if spec.resume_from else None,
        kept,
        cpu_s,
    )


# ---------------------------------------------------------------------------------------------- outputs
METRIC_COLUMNS: list[tuple[str, str]] = [
    # (parquet column, TRL log key)
    ("reward", "reward"),
    ("reward_std", "reward_std"),
    ("frac_reward_zero_std", "frac_reward_zero_std"),
    ("success", "success"),
    ("turns", "turns"),
    ("completion_length", "completions/mean_length"),
    ("clipped_ratio", "completions/clipped_ratio"),
    ("max_length_frac", "max_length_frac"),
    ("kl", "kl"),
    ("entropy", "entropy"),
    ("loss", "loss"),
    ("grad_norm", "grad_norm"),
    ("learning_rate", "learning_rate"),
    ("num_tokens", "num_tokens"),
    ("step_time", "step_time"),
]


def metrics_rows(history: list[dict[str, Any]], rollouts_at: Callable[[int], int]) -> list[dict[str, Any]]:
    """One row per optimizer step from the Trainer's log history (restored from the checkpoint on resume)."""
    rows: dict[int, dict[str, Any]] = {}
    for h in history:
        if "reward" not in h or "step" not in h:
            continue
        row: dict[str, Any] = {"step": int(h["step"])}
        for col, key in METRIC_COLUMNS:
            v = h.get(key)
            row[col] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            if row[col] is not None and math.isnan(row[col]):
                row[col] = None
        rows[row["step"]] = row
    out = [rows[k] for k in sorted(rows)]
    for r in out:
        r["rollouts"] = rollouts_at(r["step"])
        r["episodes"] = r["rollouts"] - rollouts_at(r["step"] - 1)
    return out


def copy_adapter(src: Path, dst: Path) -> None:
    """The PEFT adapter files only (no tokenizer copies, no pickled training args)."""
    dst.mkdir(parents=True, exist_ok=True)
    missing = [f for f in ADAPTER_FILES if not (src / f).is_file()]
    if missing:
        raise RuntimeError(f"{src}: trainer did not save {', '.join(missing)}")
    for f in ADAPTER_FILES:
        shutil.copy2(src / f, dst / f)
