"""The side channel between our environments and TRL: `rollout_func` (one episode of the shared rollout loop per
prompt, or pre-generated ones replayed) returns token sequences and the episodes' outcomes as columns, with the
episodes of constant-reward groups masked out of the loss (`mask_constant_groups`), and `reward_func` hands the
environment's reward to TRL.

Seeds: TRL hands `rollout_func` only the prompts (already repeated `num_generations` times by its
`RepeatSampler`), not the dataset rows. Each dataset row is one seed, and its `prompt` is the marker
`trace-seed:<seed>` (the `seed` column is kept for logging); `rollout_func` parses the marker back. Mapping
rendered prompt text -> seed instead would break when two seeds render the same opening, and would render
every prompt twice. The `num_generations` copies of a seed are one GRPO group, so advantages are normalised
within same-seed groups, as the paper does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trace_cli.agents.token_history import episode_sequence
from trace_cli.envs.synthetic.hints import hinted
from trace_cli.training.grpo_spec import GRPOSpec

SEED_PREFIX = "trace-seed:"


def seed_prompt(seed: int) -> str:
    return f"{SEED_PREFIX}{int(seed)}"


def parse_seed(prompt: Any) -> int:
    if isinstance(prompt, str) and prompt.startswith(SEED_PREFIX):
        return int(prompt[len(SEED_PREFIX) :])
    raise ValueError(f"not a trace seed prompt: {prompt!r} (expected {SEED_PREFIX}<int>)")


def make_rollout_func(spec: GRPOSpec, tokenizer, max_context: int, state: dict[str, Any], run_engine=None):
    """TRL `rollout_func(prompts, trainer)`: one episode of our shared rollout loop per prompt entry, generated
    on the run's engine (`run_engine`, training.rollout_engine.RunEngine; None: the model in this process)."""
    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.models import device

    replay = list(spec.replay)
    sampling = spec.sampling
    env0 = spec.make_env()
    hint_share = float(getattr(env0, "hint_share", 0.0))  # an admitted environment's setting
    share_of = getattr(env0, "hint_share_of", None)  # a mixture (envs.mixture): each member's own

    def hints_of(seed: int) -> int:
        """How many of the seed's group see the hint."""
        return hinted(share_of(seed) if share_of else hint_share, spec.num_generations)

    def replayed(n: int) -> dict[str, list] | None:
        """The next n pre-generated episodes (whole groups), in rollout_func's format; None when too few are left."""
        start = state.setdefault("replayed", 0)
        if n % spec.num_generations or start + n > len(replay):
            return None
        eps = replay[start : start + n]
        state["replayed"] = start + n
        state["replayed_steps"] = state.get("replayed_steps", 0) + 1
        outcomes = [(e["reward"], e["success"], e["n_actions"], e["termination"]) for e in eps]
        return rollout_columns(eps, outcomes, logprobs=False)

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        columns = episodes(prompts, trainer)
        if spec.drop_constant_groups:
            columns["env_mask"] = mask_constant_groups(
                columns["env_mask"], columns["env_reward"], spec.num_generations, trainer.accelerator
            )
        return columns

    def episodes(prompts: list, trainer) -> dict[str, list]:
        from trl.models.utils import unwrap_model_for_generation

        if replay and not spec.use_vllm:
            served = replayed(len(prompts))
            if served is not None:
                return served
        seeds = [parse_seed(p) for p in prompts]
        rank = trainer.accelerator.process_index
        run_seed = (
            (spec.seed * 7_919 + trainer.state.global_step) * 131 + rank * 17 + state.setdefault("calls", 0)
        )
        state["calls"] += 1
        t0 = time.monotonic()
        step = trainer.state.global_step
        engine = (
            run_engine.for_rollouts(
                trainer,
                trainer.accelerator.unwrap_model(trainer.model),
                step,
                main=trainer.accelerator.is_main_process,
                barrier=trainer.accelerator.wait_for_everyone,
            )
            if run_engine is not None
            else None
        )
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model:
            policy = TokenPolicy.sampling_as(
                model,
                tokenizer,
                sampling,
                top_k=spec.top_k,
                max_context=max_context,
                seed=run_seed,
                engine=engine,
                prefix_cache=None if engine is not None else device.prefix_cache(model),  # these weights only
            )
            kw = {"max_turns": sampling.max_turns, "batch_size": spec.rollout_batch_size}
            results, seqs = group_episodes(policy, spec.make_env, seeds, hints_of, **kw)
        if state.get("episode_log") is not None:  # the adapter keeps them (`episode_log`)
            version = run_engine.version(step) if run_engine is not None else None
            state["episode_log"].write(step + 1, results, hints_of, "grpo", version=version)
        state["rollout_s"] = state.get("rollout_s", 0.0) + time.monotonic() - t0
        state["episodes"] = state.get("episodes", 0) + len(results)
        state["gen_tokens"] = state.get("gen_tokens", 0) + sum(r.gen_tokens for r in results)
        outcomes = [(r.reward, r.success, r.n_actions, r.termination) for r in results]
        return rollout_columns(seqs, outcomes, logprobs=spec.use_vllm)

    return rollout_func


def mask_constant_groups(
    env_mask: list[list[int]], rewards: list[float], num_generations: int, accelerator
) -> list[list[int]]:
    """`env_mask` with the episodes of constant-reward groups zeroed: they carry no signal (zero advantage), and
    TRL takes the loss mask's tokens as the loss normaliser (dapo: `num_items_in_batch`), so they would dilute
    the groups that do (ARCHITECTURE.md, "The method": "groups with constant reward dropped"). A group's episodes
    can sit on several processes: every process gathers the rewards of all (in rank order, as TRL does) and masks
    its own. When every group is constant, nothing is masked (the loss is zero either way at beta 0; TRL's
    normaliser would divide by zero)."""
    import torch

    local = torch.tensor([float(r) for r in rewards], dtype=torch.float32, device=accelerator.device)
    groups = accelerator.gather(local).view(-1, num_generations)
    const = groups.max(dim=1).values == groups.min(dim=1).values
    if bool(const.all()):
        return env_mask
    rows = const.repeat_interleave(num_generations).tolist()
    mine = rows[accelerator.process_index * len(rewards) : (accelerator.process_index + 1) * len(rewards)]
    return [[0] * len(m) if drop else list(m) for m, drop in zip(env_mask, mine, strict=True)]


def group_episodes(
    policy, make_env, seeds: list[int], hints: int | Callable[[int], int], **kw
) -> tuple[list, list[dict[str, Any]]]:
    """One episode per entry of `seeds` (a group's copies of a seed are consecutive) and its token sequence. The
    first `hints` episodes of each group (or `hints(seed)`) see the task's `<expert_guidance>`
    (`hints.HintedEnv`); their results keep the hinted prompt, their sequences the original one: the gradient step
    sees the prompt without hint."""
    from trace_cli.envs.rollout import rollout
    from trace_cli.envs.synthetic.hints import HintedEnv

    rank: list[int] = []
    seen: dict[int, int] = {}
    for s in seeds:  # each episode's place in its group
        rank.append(seen.get(s, 0))
        seen[s] = rank[-1] + 1
    jobs = [(s, i) for i, s in enumerate(seeds)]
    count = hints if callable(hints) else (lambda seed: hints)
    chosen = {i for i, k in enumerate(rank) if k < count(seeds[i])}
    with_hint = [j for j in jobs if j[1] in chosen]
    done = rollout(policy, lambda: HintedEnv(make_env()), with_hint, **kw)
    done += rollout(policy, make_env, [j for j in jobs if j[1] not in chosen], **kw)
    results = sorted(done, key=lambda r: r.trial)
    seqs = [episode_sequence(r.turns, policy.eos_id) for r in results]
    for r, seq in zip(results, seqs, strict=True):
        if r.trial in chosen and r.turns:
            seq["prompt_ids"] = original_prompt_ids(policy, r)
            # sampled from the hinted prompt, trained on the plain one: the sampler's log-probabilities are of
            # another context, so the episode stays out of TRL's importance-sampling correction (a NaN sampling
            # log-probability gives ratio 1: trl GRPOTrainer._generate_and_score_completions), where it would
            # be masked or clipped away, though it is often its group's only success
            seq["logprobs"] = [float("nan")] * len(seq["completion_ids"])
    return results, seqs


def original_prompt_ids(policy, result) -> list[int]:
    """The episode's first prompt without the hint, rendered and encoded as the policy rendered the hinted one."""
    from trace_cli.envs.synthetic.hints import strip_guidance
    from trace_cli.models.chat import render

    msgs = result.messages
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
    opening = [
        dict(m, content=strip_guidance(m["content"])) if m["role"] == "system" else m for m in msgs[:first]
    ]
    return policy._encode(render(policy.tok, opening, result.tools, add_generation_prompt=True))


def rollout_columns(
    seqs: Sequence[Mapping[str, Any]], outcomes: Sequence[tuple[float, bool, int, str]], *, logprobs: bool
) -> dict[str, list]:
    """What rollout_func returns to TRL for episodes given as token sequences (prompt_ids, completion_ids,
    env_mask[, logprobs]) and their (reward, success, actions, termination): generated or replayed alike."""
    return {
        "prompt_ids": [list(s["prompt_ids"]) for s in seqs],
        "completion_ids": [list(s["completion_ids"]) for s in seqs],
        "env_mask": [list(s["env_mask"]) for s in seqs],
        "logprobs": [s["logprobs"] for s in seqs] if logprobs else None,
        "env_reward": [float(r) for r, _, _, _ in outcomes],
        "env_success": [float(ok) for _, ok, _, _ in outcomes],
        "env_turns": [float(n) for _, _, n, _ in outcomes],
        "env_max_length": [float(t == "max_length") for _, _, _, t in outcomes],
        # the tokens the model generated (TRL counts its length metrics on env_mask, which
        # mask_constant_groups zeroes for the groups out of the loss)
        "env_model_tokens": [float(sum(s["env_mask"])) for s in seqs],
    }


# metric logged by the reward function -> the rollout_func column it averages
REWARD_METRICS = {
    "success": "env_success",
    "turns": "env_turns",
    "max_length_frac": "env_max_length",
    "model_tokens": "env_model_tokens",
}


def make_reward_func():
    """The environment's graded final reward (`env.verify()`), passed through from rollout_func; TRL passes the
    other columns rollout_func returned (success, turns, max_length, model tokens) by name, and they are logged
    as metrics (REWARD_METRICS)."""

    def env_reward(env_reward, log_metric=None, **columns) -> list[float]:
        rewards = [float(r) for r in env_reward]
        if log_metric is not None:
            for name, column in REWARD_METRICS.items():
                vals = columns.get(column)
                if vals:
                    log_metric(name, sum(vals) / len(vals))
        return rewards

    return env_reward
