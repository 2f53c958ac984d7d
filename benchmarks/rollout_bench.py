#!/usr/bin/env python
"""Rollout benchmark: episodes/s and generated tokens/s of `trace eval`'s rollout loop vs a naive loop.

What is measured (issue 3):
  * batched: `trace_cli.envs.rollout.rollout` driving `trace_cli.agents.hf.HFPolicy` — the code
    `trace eval` runs: every active episode's next turn is generated in one left-padded, KV-cached
    `model.generate` call, finished episodes are replaced from the queue — at batch sizes 1, 8 and 32;
  * naive: one episode at a time, one `model.generate` call per turn, on the same model and tokenizer,
    with the same prompts (the same chat template rendering), the same environment and user simulator,
    the same `max_new_tokens` and turn limit, greedy decoding.
Both run the same seeds; greedy decoding must give identical episodes (checked, column `same`).

  * raw (issue 12): plain batched `model.generate` on the episodes' first prompts at the same batch size, every
    row generating `max_new_tokens` tokens (no stopping): the throughput ceiling. The rollout loop keeps each
    episode's KV cache across turns (each turn feeds only its new tokens); column `x raw` = rollout tok/s /
    raw tok/s at the same batch size (goal >= 0.5 on multi-turn episodes). `--compare-no-reuse` adds rows
    with the cache reuse off (a full re-prefill every turn), `--compare-prefix-cache` rows whose episodes
    share a prefix cache (an episode's first turn starts from what earlier ones prefilled: the system prompt
    and tool schemas).

Models: the `tiny` and `small` presets, built offline with the `model` stage into a temporary store, plus
any `--model REF` (a local HF dir, or a store reference with `--store`), e.g. a trained base agent, and with
`--smollm2` the offline SmolLM2-135M-Instruct (`trace model import smollm2-135m-instruct`).
Untrained preset models never emit the end-of-turn token: every turn runs to `max_new_tokens` and the
scripted user ends the episode after one message, so the preset rows measure raw generation throughput
on full-length turns; a trained model (`--model`) gives realistic multi-turn episodes.

    python benchmarks/rollout_bench.py --quick          # smoke run: 8 episodes, short turns
    python benchmarks/rollout_bench.py                   # 64 episodes, batch sizes 1 8 32, 160 tokens/turn
    python benchmarks/rollout_bench.py --model store://model/base --store store --presets
    python benchmarks/rollout_bench.py --threads 1       # torch threads (default: torch's choice)
    python benchmarks/rollout_bench.py --presets small --model store://model/smollm2-sft \
        --store /tmp/smollm2-e2e/store --batch-sizes 8 --episodes 16 --naive-episodes 4 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="tiny smoke run (8 episodes, 32 tokens/turn, 4 turns)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "rollout_bench.json")
    ap.add_argument(
        "--presets",
        nargs="*",
        default=["tiny", "small"],
        choices=["tiny", "small"],
        help="model presets to build and measure (none: only --model)",
    )
    ap.add_argument("--model", action="append", default=[], help="extra model reference (repeatable)")
    ap.add_argument("--store", type=Path, help="store to resolve --model store references in")
    ap.add_argument("--smollm2", action="store_true", help="also import and measure SmolLM2-135M-Instruct")
    ap.add_argument("--compare-no-reuse", action="store_true", help="rows with KV-cache reuse off too")
    ap.add_argument(
        "--compare-prefix-cache",
        action="store_true",
        help="rows with a prefix cache shared by the episodes too (models.prefix_cache, 1 GiB)",
    )
    ap.add_argument("--env", default="shop", help="environment reference")
    ap.add_argument("--batch-sizes", type=int, nargs="+", help="default 1 8 32 (quick: 1 8)")
    ap.add_argument("--episodes", type=int, help="episodes per batched run (default 64; quick 8)")
    ap.add_argument("--naive-episodes", type=int, help="episodes of the naive loop (default 16; quick 8)")
    ap.add_argument(
        "--max-new-tokens", type=int, help="tokens per turn (default 160 = trace eval's; quick 32)"
    )
    ap.add_argument("--max-turns", type=int, help="agent actions per episode (default 12; quick 4)")
    ap.add_argument("--corpus-seeds", type=int, help="tokenizer corpus per preset (default 300; quick 20)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--workdir", type=Path, help="where preset models are built (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    a = ap.parse_args(argv)
    q = a.quick
    a.batch_sizes = a.batch_sizes or ([1, 8] if q else [1, 8, 32])
    a.episodes = a.episodes or (8 if q else 64)
    a.naive_episodes = a.naive_episodes or (8 if q else 16)
    a.max_new_tokens = a.max_new_tokens or (32 if q else 160)
    a.max_turns = a.max_turns or (4 if q else 12)
    a.corpus_seeds = a.corpus_seeds or (20 if q else 300)
    if not a.presets and not a.model and not a.smollm2:
        ap.error("nothing to measure: give --presets and/or --model")
    if min(a.batch_sizes) < 1 or a.episodes < 1 or a.naive_episodes < 1:
        ap.error("batch sizes and episode counts must be >= 1")
    return a


# --------------------------------------------------------------------------------------------------- loops
def naive_rollout(model, tok, make_env, seeds: list[int], *, max_new_tokens: int, max_turns: int):
    """One episode at a time, one `generate` per turn: the baseline the rollout loop is measured against."""
    import torch

    from trace_cli.agents.base import text_turn
    from trace_cli.envs.rollout import apply_actions, finish, start
    from trace_cli.models.chat import eos_ids, render
    from trace_cli.models.importer import read_meta
    from trace_cli.models.toolcalls import parse

    eos = eos_ids(tok, model.generation_config)
    fmt = read_meta(getattr(model, "name_or_path", None)).get("tool_format", "hermes")
    results, calls = [], 0
    for seed in seeds:
        st = start(make_env(), seed)
        while not st.done:
            prompt = render(tok, st.messages, st.tools, add_generation_prompt=True)
            enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
            with torch.inference_mode():
                out = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=eos,
                )
            calls += 1
            ids = out[0, enc["input_ids"].shape[1] :].tolist()
            ids = ids[: next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))]
            st.gen_tokens += len(ids)
            text = tok.decode(ids, skip_special_tokens=False)
            apply_actions(st, text_turn(text, lambda t: parse(t, fmt, tok)), max_turns=max_turns)
        results.append(finish(st))
    return results, calls


def raw_generate(model, tok, make_env, seeds: list[int], *, batch_size: int, max_new_tokens: int) -> dict:
    """Plain batched `generate` over the first prompts, `max_new_tokens` per row (stop tokens ignored)."""
    import torch

    from trace_cli.envs.rollout import start
    from trace_cli.models.chat import render

    prompts = []
    for s in seeds:
        st = start(make_env(), s)
        prompts.append(render(tok, st.messages, st.tools, add_generation_prompt=True))
    tok.padding_side = "left"
    toks, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        enc = tok(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **enc.to(model.device),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        toks += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    wall = time.perf_counter() - t0
    return {"gen_tokens": toks, "wall_s": round(wall, 3), "gen_tokens_per_s": round(toks / wall, 1)}


class CountingPolicy:
    """HFPolicy unchanged, plus a count of `generate` calls (one per round)."""

    def __init__(self, policy):
        self.policy, self.calls = policy, 0

    def act(self, states):
        self.calls += 1
        return self.policy.act(states)


def measure(name: str, preset: str | None, ref, args) -> list[dict[str, Any]]:
    from trace_cli.agents.hf import HFPolicy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout
    from trace_cli.models.refs import load_hf

    model, tok = load_hf(ref)
    n_params = sum(p.numel() for p in model.parameters())

    def env_factory():
        return make_env(args.env)

    # warm-up (allocator, kernels, lazy imports): one short generation, not timed
    warm = HFPolicy(model, tok, temperature=0.0, max_new_tokens=4)
    rollout(warm, env_factory, [(args.first_seed, 0)], max_turns=1, batch_size=1)

    seeds = list(range(args.first_seed, args.first_seed + args.episodes))
    naive_seeds = seeds[: args.naive_episodes]
    rows: list[dict[str, Any]] = []

    t0 = time.perf_counter()
    naive, calls = naive_rollout(
        model, tok, env_factory, naive_seeds, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns
    )
    wall = time.perf_counter() - t0
    rows.append(_row(name, preset, n_params, "naive", 1, naive, wall, calls))
    naive_by_seed = {r.seed: r for r in naive}

    from trace_cli.models.importer import context_of, read_meta

    meta = read_meta(ref.path)
    from trace_cli.models.prefix_cache import PrefixCache

    modes = [("rollout", True)] + ([("rollout-noreuse", False)] if args.compare_no_reuse else [])
    modes += [("rollout-prefix", True)] if args.compare_prefix_cache else []
    for bs, (mode, reuse) in [(b, m) for b in args.batch_sizes for m in modes]:
        raw = raw_generate(
            model,
            tok,
            env_factory,
            seeds[: max(bs, min(len(seeds), 2 * bs))],
            batch_size=bs,
            max_new_tokens=args.max_new_tokens,
        )
        hf = HFPolicy(
            model,
            tok,
            temperature=0.0,
            max_new_tokens=args.max_new_tokens,
            name=name,
            tool_format=meta.get("tool_format"),
            max_context=context_of(model.config),
            reuse_cache=reuse,
            prefix_cache=PrefixCache(1 << 30) if mode == "rollout-prefix" else None,
        )
        policy = CountingPolicy(hf)
        policy.parse = hf.parse
        t0 = time.perf_counter()
        res = rollout(policy, env_factory, [(s, 0) for s in seeds], max_turns=args.max_turns, batch_size=bs)
        wall = time.perf_counter() - t0
        row = _row(name, preset, n_params, mode, bs, res, wall, policy.calls)
        row["raw_gen_tokens_per_s"] = raw["gen_tokens_per_s"]
        row["x_raw"] = round(row["gen_tokens_per_s"] / raw["gen_tokens_per_s"], 2)
        same = [
            r.messages == naive_by_seed[r.seed].messages and r.reward == naive_by_seed[r.seed].reward
            for r in res
            if r.seed in naive_by_seed
        ]
        row["same_as_naive"] = all(same)
        row["compared_episodes"] = len(same)
        rows.append(row)
        print(
            f"  {name} {mode} bs={bs}: {row['episodes_per_s']:.2f} ep/s, {row['gen_tokens_per_s']:.0f} tok/s "
            f"(raw generate {raw['gen_tokens_per_s']:.0f} tok/s, x{row['x_raw']})",
            file=sys.stderr,
        )
    naive_eps = rows[0]["episodes_per_s"]
    naive_tps = rows[0]["gen_tokens_per_s"]
    for r in rows:
        r["speedup_episodes"] = round(r["episodes_per_s"] / naive_eps, 2) if naive_eps else None
        r["speedup_tokens"] = round(r["gen_tokens_per_s"] / naive_tps, 2) if naive_tps else None
    rows[0]["same_as_naive"] = True
    del model
    return rows


def _row(name, preset, n_params, mode, bs, results, wall, calls) -> dict[str, Any]:
    n = len(results)
    toks = sum(r.gen_tokens for r in results)
    turns = sum(r.n_actions for r in results)
    return {
        "model": name,
        "preset": preset,
        "parameters": n_params,
        "mode": mode,
        "batch_size": bs,
        "episodes": n,
        "turns": turns,
        "mean_turns": round(turns / n, 2),
        "generate_calls": calls,
        "gen_tokens": toks,
        "wall_s": round(wall, 3),
        "episodes_per_s": round(n / wall, 3),
        "gen_tokens_per_s": round(toks / wall, 1),
        "success": round(sum(r.success for r in results) / n, 3),
    }


# ---------------------------------------------------------------------------------------------------- main
def machine_info(threads: int) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": threads,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        ("model", "model"),
        ("params", "parameters"),
        ("mode", "mode"),
        ("bs", "batch_size"),
        ("episodes", "episodes"),
        ("turns/ep", "mean_turns"),
        ("gen calls", "generate_calls"),
        ("gen tokens", "gen_tokens"),
        ("wall s", "wall_s"),
        ("ep/s", "episodes_per_s"),
        ("tok/s", "gen_tokens_per_s"),
        ("x naive ep/s", "speedup_episodes"),
        ("raw tok/s", "raw_gen_tokens_per_s"),
        ("x raw", "x_raw"),
        ("same", "same_as_naive"),
    ]
    table = [[str(r.get(k)) for _, k in cols] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, (h, _) in enumerate(cols)]
    print("  ".join(h.ljust(w) for (h, _), w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRACE_NO_PROGRESS", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    models: list[tuple[str, str | None, Any, dict[str, Any]]] = []
    try:
        for preset in args.presets:
            t0 = time.perf_counter()
            out = execute(
                "model", {"preset": preset, "corpus_seeds": args.corpus_seeds}, Store(workdir / "store")
            )
            built = {
                "build_s": round(time.perf_counter() - t0, 2),
                "skipped": out.skipped,
                **out.main.summary,
            }
            print(
                f"built {preset}: {built['parameters']:,} parameters, vocab {built['vocab_size']} "
                f"({built['build_s']} s)",
                file=sys.stderr,
            )
            models.append((preset, preset, resolve_model(str(out.main.path / "hf")), built))
        if args.smollm2:
            t0 = time.perf_counter()
            out = execute("model", {"source": "smollm2-135m-instruct"}, Store(workdir / "store"))
            built = {"build_s": round(time.perf_counter() - t0, 2), **out.main.summary}
            models.append(("smollm2", None, resolve_model(str(out.main.path / "hf")), built))
        for ref in args.model:
            models.append((ref, None, resolve_model(ref, Store(args.store) if args.store else None), {}))

        rows, builds = [], {}
        for name, preset, ref, built in models:
            print(f"measuring {name} ...", file=sys.stderr)
            builds[name] = built
            rows += measure(name, preset, ref, args)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print_table(rows)
    doc = {
        "benchmark": "rollout_bench",
        "quick": args.quick,
        "settings": {
            "env": args.env,
            "episodes": args.episodes,
            "naive_episodes": args.naive_episodes,
            "batch_sizes": args.batch_sizes,
            "max_new_tokens": args.max_new_tokens,
            "max_turns": args.max_turns,
            "corpus_seeds": args.corpus_seeds,
            "greedy": True,
        },
        "machine": machine_info(torch.get_num_threads()),
        "models": builds,
        "results": rows,
    }
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported from a file (the tests)
    from common import command, write_result

    write_result(args.out, {"command": command(), **doc})  # with the commit and whether the tree was dirty
    print(f"\nwrote {args.out}", file=sys.stderr)
    ok = all(r["same_as_naive"] for r in rows)
    if not ok:
        print("error: batched rollouts differ from the naive loop under greedy decoding", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
