"""Supervised fine-tuning of a policy on environment demonstrations (reference solutions, optionally with
named behaviours withheld — "deficits" — so the resulting base agent fails where we decided it would).

Each demonstration is rendered with the prefix-preserving training template; the loss covers only the
assistant tokens (the template's `{% generation %}` spans), i.e. exactly what the agent emits at rollout time.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trace_cli.errors import UsageError
from trace_cli.training import from_config


@dataclass(frozen=True)
class SFTSettings:
    """The optimisation settings of an SFT run, named as the `train` config keys they come from (the schema,
    schemas/config/train.v1.json, states their defaults)."""

    epochs: float  # passes over the examples
    learning_rate: float
    batch_size: int
    seed: int
    max_minutes: float | None  # stop after this wall time (the schedule still decays over all steps)
    gradient_checkpointing: bool | None  # None: on when the model is on a GPU

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SFTSettings:
        return from_config(cls, config)


def demonstrations(
    env_ref: Any,
    seeds: list[int],
    deficits: set[str],
    store: Any = None,
    *,
    deficit_rate: float,
    seed: int,
) -> list[dict[str, Any]]:
    """One replayed demonstration per seed. With deficits, a `deficit_rate` share of them withholds the
    behaviours (1.0 = never shown); a rate below 1 leaves the agent a small chance of the right behaviour,
    which is what lets RL later amplify it."""
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import replay

    rng = random.Random(seed)
    out = []
    for s in seeds:
        env = make_env(env_ref, store=store)
        env.reset(s)
        demo = getattr(env, "demonstration", None)
        withhold = bool(deficits) and demo is not None and rng.random() < deficit_rate
        actions = demo(set(deficits)) if withhold else env.reference_actions()
        ep = replay(make_env(env_ref, store=store), s, actions)
        out.append(
            {
                "seed": s,
                "messages": ep.messages,
                "tools": ep.tools,
                "reward": ep.reward,
                "family": (ep.metadata or {}).get("family"),
            }
        )
    return out


def tokenize(
    tok, demos: list[dict[str, Any]], max_length: int | None, loss_on: str = "assistant"
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per demo; with loss_on="assistant", labels are -100 outside assistant turns,
    with "all" every token after the first is a target (language modelling on whole transcripts: tool
    results repeat ids from earlier turns, which is extra practice at copying). Demos longer than
    `max_length` (None: no limit) are dropped: `len(demos) - len(result)` is the count to report."""
    from trace_cli.models.chat import has_generation_marks, template_for

    template = template_for(tok)
    marked = has_generation_marks(template)  # {% generation %} spans give the assistant mask directly
    out = []
    for d in demos:
        if marked:
            enc = tok.apply_chat_template(
                d["messages"],
                tools=d["tools"],
                chat_template=template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                enable_thinking=False,
            )
            ids = list(enc["input_ids"])
            mask = list(enc["assistant_masks"])
        else:
            ids, mask = prefix_mask(tok, d["messages"], d["tools"], template)
        if (max_length is not None and len(ids) > max_length) or not any(mask):
            continue
        if loss_on == "all":
            out.append((ids, list(ids)))
        else:
            out.append((ids, [t if m else -100 for t, m in zip(ids, mask, strict=True)]))
    return out


def fit_examples(
    tok, demos: list[dict[str, Any]], max_length: int | None, context: int | None, loss_on: str
) -> list[tuple[list[int], list[int]]]:
    """`tokenize` within a length limit: `max_length`, or (None) the model's `context`. Demonstrations longer than
    it are dropped (counted on stderr); none left is a usage error, and so is a limit beyond the context."""
    limit = max_length if max_length is not None else context
    if context and limit and limit > context:
        raise UsageError(f"max_length {limit} exceeds the model's context ({context}); lower it")
    examples = tokenize(tok, demos, limit, loss_on)
    if not examples:
        raise UsageError(
            f"no demonstration fits max_length={limit} (model context {context}); "
            + ("raise it" if max_length is not None else "use a model with a longer context")
        )
    if len(examples) < len(demos):
        print(
            f"sft: dropped {len(demos) - len(examples)} of {len(demos)} demonstrations longer than {limit} tokens",
            file=sys.stderr,
        )
    return examples


def progress_line(m: dict[str, Any]) -> str | None:
    """The stderr line of an SFT metrics row (every 10th step)."""
    if m["step"] % 10:
        return None
    return f"step {m['step']:>5}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  {m['elapsed_s']:.0f}s"


def prefix_mask(tok, messages, tools, template: str) -> tuple[list[int], list[int]]:
    """Assistant mask for a template without `{% generation %}` markers (e.g. a model's own one): the tokens
    between the prompt of assistant turn k and the rendering through turn k, up to and including the first
    stop token (what the model generates). Needs a prefix-preserving template (checked before training)."""
    from trace_cli.models.chat import assistant_spans, eos_ids, render

    stop = set(eos_ids(tok))
    ids = tok(
        render(tok, messages, tools, add_generation_prompt=False, template=template), add_special_tokens=False
    )["input_ids"]
    mask = [0] * len(ids)
    for prompt, full in assistant_spans(tok, messages, tools, template):
        a = len(tok(prompt, add_special_tokens=False)["input_ids"])
        b = len(tok(full, add_special_tokens=False)["input_ids"])
        for k in range(a, min(b, len(ids))):
            mask[k] = 1
            if ids[k] in stop:
                break
    return ids, mask


def pad_batch(rows: list[tuple[list[int], list[int]]], pad: int):
    """(input_ids, attention_mask, labels) tensors for (ids, labels) rows, right-padded (labels with -100)."""
    import torch

    L = max(len(x) for x, _ in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    labels = torch.full((len(rows), L), -100, dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.long)
    for r, (x, y) in enumerate(rows):
        ids[r, : len(x)] = torch.tensor(x)
        labels[r, : len(y)] = torch.tensor(y)
        att[r, : len(x)] = 1
    return ids, att, labels


def assistant_loss(model, ids, att, labels, reduction: str = "mean"):
    """Next-token cross-entropy on labelled positions only; the LM head runs just there (most tokens are
    prompt, so this skips most of the vocabulary projection). `reduction` "sum": the tokens' summed loss (data
    parallel: each process's share, divided by the whole batch's tokens)."""
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    ids, att, labels = (t.to(base.device) for t in (ids, att, labels))  # batches are built on the CPU
    h = base.model(input_ids=ids, attention_mask=att).last_hidden_state
    tgt = labels[:, 1:]
    sel = tgt != -100
    logits = base.lm_head(h[:, :-1][sel])
    return F.cross_entropy(logits.float(), tgt[sel], reduction=reduction)


class DataParallel:
    """Data parallelism for SFT under `accelerate launch` / torchrun (several processes; one is a plain run):
    every process builds the same batches (same seed), trains on its share of each (`share`: rows rank, rank +
    world, ...), and the gradients are summed over processes in one all-reduce, each process's loss being its
    tokens' summed loss over the whole batch's tokens, so a step is the single-process step on the same batch
    (float summation order aside). Parameters start equal (broadcast from rank 0: a fresh LoRA is random), and
    the time limit is decided together (no process is left waiting in a collective)."""

    def __init__(self, group=None):
        self.world = int(getattr(group, "num_processes", 1) or 1)
        self.rank = int(getattr(group, "process_index", 0) or 0)

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, rows: list[int]) -> list[int]:
        return rows[self.rank :: self.world]

    def start(self, params) -> None:
        if self.active:
            import torch.distributed as dist

            for p in params:
                dist.broadcast(p.data, src=0)

    def agree(self, labelled: int, tokens: int, stop: bool, device) -> tuple[int, int, bool]:
        """The whole batch's labelled tokens and tokens, and whether any process wants to stop."""
        if not self.active:
            return labelled, tokens, stop
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(labelled), float(tokens), float(stop)], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return int(t[0].item()), int(t[1].item()), bool(t[2].item() > 0)

    def reduce_grads(self, params, loss):
        """Sum every gradient (and the loss, for the log) over processes; returns the summed loss."""
        if not self.active:
            return loss
        import torch
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(grads[0].dtype)])
        dist.all_reduce(flat)
        k = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[k : k + n].view_as(p).clone()
            k += n
        return flat[k]


def train_sft(
    model,
    tok,
    examples: list[tuple[list[int], list[int]]],
    settings: SFTSettings,
    log: Callable[[dict[str, Any]], None] | None = None,
    group: Any = None,
) -> list[dict[str, Any]]:
    """AdamW + linear warmup + cosine decay over length-bucketed batches; returns per-step metrics. `group`: the
    run's process group (training.dist.process_group) when launched as several processes (`DataParallel`)."""
    import torch

    s = settings
    dp = DataParallel(group)
    batch_size, max_minutes = s.batch_size, s.max_minutes
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    model.train()
    checkpointing = _checkpointing(model, s.gradient_checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    dp.start(params)
    dev = params[0].device
    opt = torch.optim.AdamW(params, lr=s.learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    total = max(1, int(steps_per_epoch * s.epochs))
    warmup = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))
    )
    pad = tok.pad_token_id
    metrics: list[dict[str, Any]] = []
    t0 = time.monotonic()
    step = 0
    while step < total:
        order = list(range(len(examples)))
        rng.shuffle(order)
        # bucket by length inside chunks of 32 batches: less padding, still shuffled
        chunk = batch_size * 32
        batches = []
        for i in range(0, len(order), chunk):
            part = sorted(order[i : i + chunk], key=lambda j: len(examples[j][0]))
            batches += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
        rng.shuffle(batches)
        for b in batches:
            if step >= total:
                break
            late = max_minutes is not None and time.monotonic() - t0 > max_minutes * 60
            mine = dp.share(b)
            rows = [examples[j] for j in mine]
            ids, att, labels = pad_batch(rows, pad) if rows else (None, None, None)
            labelled, tokens, stop = dp.agree(
                int((labels[:, 1:] != -100).sum()) if rows else 0, int(att.sum()) if rows else 0, late, dev
            )
            if stop:
                _end_checkpointing(model, checkpointing)
                return metrics
            if not dp.active:  # one process: the batch's mean (bit for bit what single-process runs gave)
                loss = assistant_loss(model, ids, att, labels)
            elif rows:
                loss = assistant_loss(model, ids, att, labels, reduction="sum") / max(1, labelled)
            else:  # a share with no row still joins the all-reduce, with zero gradients
                loss = sum(p.sum() for p in params) * 0.0
            loss.backward()
            loss = dp.reduce_grads(params, loss)
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            m = {
                "step": step,
                "loss": float(loss.detach()),
                "grad_norm": float(gn),
                "lr": sched.get_last_lr()[0],
                "tokens": tokens,
                "elapsed_s": time.monotonic() - t0,
            }
            metrics.append(m)
            if log:
                log(m)
            step += 1
    _end_checkpointing(model, checkpointing)
    model.eval()
    return metrics


def _checkpointing(model, wanted: bool | None) -> bool:
    """Turn gradient checkpointing on (`wanted`, or None: when the model is on a GPU): each layer's activations
    are recomputed in the backward pass, so a long demonstration's memory is one layer's, not every layer's.
    With a (PEFT) adapter the embeddings' output must require grad for the recomputed layers to get one."""
    on = wanted if wanted is not None else next(model.parameters()).device.type == "cuda"
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    return bool(on)


def _end_checkpointing(model, on: bool) -> None:
    if on:
        model.gradient_checkpointing_disable()
