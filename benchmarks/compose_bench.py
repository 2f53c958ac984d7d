#!/usr/bin/env python
"""Compose benchmark: greedy decode tokens/s of each composition method against the base model with one
LoRA merged into its weights (what serving a single adapter costs).

1. Builds the `small` preset offline in a temp store (or reuses --store), and SmolLM2-135M-Instruct when
   `trace model import` can provide it (skipped when it cannot).
2. Writes two random non-zero LoRA adapters (r 16, all linear layers) as adapter artifacts and composes them
   three ways (router, moe with untrained gates routed to experts by a fixed gate, merge).
3. Decodes `--tokens` new tokens after a shop prompt (batch 1, greedy, KV cache), `--repeats` times, and
   reports the median tokens/s and the ratio to the merged-LoRA baseline (prefill included), and the same
   for decode steps alone (`decode_ratio`: the prompt prefilled once, then one token per forward). Methods
   are timed interleaved, round by round, so a shared machine's changing load moves them alike. The router's time includes its
   classifier forward pass and the weight merge (once per conversation): the classifier feeds the conversation
   and its question after the skill list's keys/values (the same in every conversation, computed at the policy's
   first classification, in the warm-up round), and on a CPU the merged weights of the last mix stay resident.

Goals (issues 13, 24): moe >= 0.8x, router >= 0.95x of the merged-LoRA baseline.

    python benchmarks/compose_bench.py               # small preset (+ SmolLM2 when importable)
    python benchmarks/compose_bench.py --quick       # fewer tokens and repeats
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import command, machine, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compose"))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # compose_helpers imports tinymodel
GOALS = {"moe": 0.8, "router": 0.95}
BASELINE = "base + 1 LoRA merged"


def _prompt(tok) -> str:
    from trace_cli.envs.registry import make_env
    from trace_cli.models.chat import render

    obs = make_env("shop").reset(0)
    return render(
        tok,
        [{"role": "system", "content": obs.system_prompt}, *obs.messages],
        obs.tools,
        add_generation_prompt=True,
    )


def _decode_once(model, enc, tokens: int) -> float:
    """Seconds per decode step: the prompt prefilled (not timed), then `tokens` greedy steps of one token
    each with the KV cache, as generate runs them."""
    import torch

    with torch.inference_mode():
        out = model(**enc, use_cache=True)
        am = enc["attention_mask"]
        ids = out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(tokens):
            am = torch.cat([am, am.new_ones(am.shape[0], 1)], 1)
            out = model(input_ids=ids, attention_mask=am, past_key_values=out.past_key_values)
            ids = out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - t) / tokens


def bench_model(store, base_ref: str, label: str, tokens: int, repeats: int) -> list[dict]:
    import torch
    from compose_helpers import make_adapter
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.compose.policy import load_composition_policy
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.base import execute

    base = resolve_model(base_ref, store)
    arts = [
        make_adapter(store, base_ref, cap, "shop", seed=i + 1, scale=0.02, r=16, name=f"{label}-{cap[:4]}")
        for i, cap in enumerate(["structured_data_reasoning", "tool_calling_precision"])
    ]
    tok = AutoTokenizer.from_pretrained(base.path, padding_side="left")
    prompt = _prompt(tok)
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    gen = {
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "do_sample": False,
        "pad_token_id": tok.pad_token_id,
    }
    one = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base.path), arts[0].path / "adapter")
    one = one.merge_and_unload().eval()
    # method -> (one timed generate call, the model its decode steps run on, what to do before them)
    runs: dict[str, tuple] = {
        BASELINE: (lambda: one.generate(**enc, **gen), one, lambda: None),
    }
    adapters = [a.uri for a in arts]
    for method in ("router", "moe", "merge"):
        cfg = {"method": method, "adapters": adapters, "base": base_ref}
        if method == "moe":
            cfg["moe"] = {"target": "shop", "seeds": "0:4", "steps": 0}
        art = execute("compose", cfg, store).main
        pol = load_composition_policy(art.path, base.path, temperature=0.0, max_new_tokens=tokens)
        if method == "moe":  # every token routed to expert 1: the worst case, a LoRA delta in every layer
            for layer in pol.routing["layers"].values():
                layer.gate = _forced(layer.gate, 1)
        if method == "router":
            from trace_cli.envs.registry import make_env
            from trace_cli.envs.rollout import start

            def run(pol=pol):
                st = start(make_env("shop"), 0)
                pol.route([st.messages])  # classifier pass + merge, once per conversation
                pol.merger.apply({1: 1.0})
                pol.model.generate(**enc, **gen)

            runs[method] = (run, pol.model, lambda pol=pol: pol.merger.apply({1: 1.0}))
        else:
            runs[method] = (lambda pol=pol: pol.model.generate(**enc, **gen), pol.model, lambda: None)
    # interleaved: every repeat times every method back to back, so a change in the machine's load (shared
    # machines) moves all of them alike; the first round is a warm-up
    gen_t: dict[str, list[float]] = {m: [] for m in runs}
    dec_t: dict[str, list[float]] = {m: [] for m in runs}
    for r in range(repeats + 1):
        for m, (fn, model, prep) in runs.items():
            with torch.inference_mode():
                t = time.perf_counter()
                fn()
                g = time.perf_counter() - t
                prep()
            d = _decode_once(model, enc, tokens)
            if r:
                gen_t[m].append(g)
                dec_t[m].append(d)
    t_base, d_base = statistics.median(gen_t[BASELINE]), statistics.median(dec_t[BASELINE])
    rows = []
    for m in runs:
        t, d = statistics.median(gen_t[m]), statistics.median(dec_t[m])
        rows.append(
            {
                "model": label,
                "method": m,
                "tok_s": tokens / t,
                "ratio": t_base / t,
                "decode_tok_s": 1 / d,
                "decode_ratio": d_base / d,
            }
        )
    return rows


def _forced(gate, slot: int):
    """The gate as the same Linear (its full matmul, the real cost) with a bias that makes `slot` win for
    every token: a delta in every layer. (A wrapper module around the gate would add a module call and two
    ops per layer that a served composition does not have.)"""
    import torch

    forced = torch.nn.Linear(gate.in_features, gate.out_features, bias=True)
    forced = forced.to(gate.weight.device, gate.weight.dtype)
    with torch.no_grad():
        forced.weight.copy_(gate.weight)
        forced.bias.zero_()
        forced.bias[slot] = 10.0
    return forced


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--store", help="Reuse this store.")
    ap.add_argument("--small-only", action="store_true", help="Skip SmolLM2-135M.")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compose_bench.json"))
    args = ap.parse_args()
    tokens, repeats = (24, 3) if args.quick else (args.tokens, args.repeats)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from compose_helpers import register_envs

    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    register_envs()
    store = Store(args.store or tempfile.mkdtemp(prefix="compose-bench-") + "/store")
    small = execute("model", {"preset": "small", "seed": 0}, store, name="bench-small").main
    rows = bench_model(store, small.uri, "small", tokens, repeats)
    skipped = []
    try:
        if args.small_only:
            raise RuntimeError("--small-only")
        smol = execute("model", {"source": "smollm2-135m-instruct"}, store, name="bench-smollm2").main
        rows += bench_model(store, smol.uri, "smollm2-135m", tokens, repeats)
    except Exception as e:  # noqa: BLE001 - SmolLM2 is optional: no wheel, no import support, no config key
        skipped.append(f"smollm2: {type(e).__name__}: {str(e)[:160]}")
    print(
        f"{'model':<14} {'method':<22} {'tok/s':>8} {'x base+LoRA':>12} {'decode tok/s':>13} "
        f"{'decode x':>9} {'goal':>6}"
    )
    for r in rows:
        goal = GOALS.get(r["method"])
        mark = "" if goal is None else (f">={goal}" + (" ok" if r["ratio"] >= goal else " MISS"))
        print(
            f"{r['model']:<14} {r['method']:<22} {r['tok_s']:>8.1f} {r['ratio']:>12.3f} "
            f"{r['decode_tok_s']:>13.1f} {r['decode_ratio']:>9.3f} {mark:>6}"
        )
    for s in skipped:
        print(f"skipped {s}")
    result = {
        "command": command(),
        "rows": rows,
        "skipped": skipped,
        "tokens": tokens,
        "repeats": repeats,
        "goals": GOALS,
        "machine": machine("torch", "transformers", threads=torch.get_num_threads()),
    }
    print(f"wrote {write_result(args.out, result)}")  # stamped with the commit and whether the tree was dirty
    return 0


if __name__ == "__main__":
    sys.exit(main())
