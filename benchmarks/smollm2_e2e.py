#!/usr/bin/env python
"""SmolLM2-135M-Instruct end to end (issue 12; a benchmark, not CI): import the offline model, LoRA SFT on shop
demonstrations, eval pass@1 on held-out shop seeds, then one GRPO step on the SFT model (non-zero adapter).

Everything goes through the stages `trace` runs (`model` import, `train --method sft|grpo`, `eval`) in one
store, with the defaults for imported checkpoints (LoRA r16 a16, SFT lr 3e-4, max_length from the
demonstrations). Prints a table and writes benchmarks/results/smollm2_e2e.json. Goal: pass@1 >= 0.3 on 50 seeds.

    OMP_NUM_THREADS=1 python benchmarks/smollm2_e2e.py                      # ~2 h on a loaded 2-core CPU

Measured (2026-12-03, 160 demonstrations, one thread, load 3-4): SFT 3,158 s (final loss 0.062), pass@1 0.38 on
shop seeds 0:50 (19/50; eval 3,176 s). The GRPO step uses 2 episodes per micro-step with gradient checkpointing:
with 8 (or 4) episodes of up to 2,048 completion tokens the step's logits and activations outgrew 24 GB (OOM).
    OMP_NUM_THREADS=1 python benchmarks/smollm2_e2e.py --demos 8 --eval-seeds 4 --no-grpo   # smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from common import RESULTS, Stages, command, print_table, write_result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=Path("/tmp/smollm2-e2e/store"))
    ap.add_argument(
        "--demos", type=int, default=160, help="SFT demonstrations (one per seed, full transcripts)"
    )
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--eval-seeds", type=int, default=50, help="held-out shop seeds 0:N")
    ap.add_argument("--eval-batch", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-grpo", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "smollm2_e2e.json")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    os.environ.setdefault("TRACE_NO_PROGRESS", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trace_cli.errors import TraceError

    stages = Stages(a.store)
    res: dict = {"command": command(), "threads": a.threads}
    t_all = time.monotonic()

    def step(label, stage, cfg, **kw):
        out = stages.run(label, stage, cfg, **kw)
        res[f"{label}_s"] = stages.timings[label]
        return out.main

    base = step("import", "model", {"source": "smollm2-135m-instruct"}, name="smollm2")
    res["import"] = base.summary
    sft_cfg = {
        "method": "sft",
        "env": "shop",
        "model": base.uri,
        "seeds": f"100000:{100000 + a.demos}",
        "batch_size": a.batch_size,
        "epochs": a.epochs,
    }
    sft = step("sft", "train", sft_cfg, name="smollm2-sft")
    res["sft"] = sft.summary
    ev_cfg = {
        "model": sft.uri,
        "env": "shop",
        "seeds": f"0:{a.eval_seeds}",
        "batch_size": a.eval_batch,
        "max_new_tokens": a.max_new_tokens,
    }
    ev = step("eval", "eval", ev_cfg, name="smollm2-sft-eval")
    res["eval"] = ev.summary
    if not a.no_grpo:
        grpo_cfg = {
            "method": "grpo",
            "env": "shop",
            "model": sft.uri,
            "seeds": "100500:100600",
            "num_generations": 4,
            "per_device_batch_size": 2,
            "gradient_accumulation_steps": 4,
            "gradient_checkpointing": True,
            "max_steps": 1,
            "max_new_tokens": a.max_new_tokens,
            "max_completion_length": 1024,
            "rollout_batch_size": 8,
            "checkpoint_every": 0,
        }
        try:
            g = step("grpo", "train", grpo_cfg, name="smollm2-grpo1")
            res["grpo"] = g.summary
            res["grpo_adapter_nonzero"] = _nonzero(g.path / "adapter" / "adapter_model.safetensors")
        except TraceError as e:
            res["grpo_error"] = f"exit {e.exit_code}: {e}"
    res["total_s"] = round(time.monotonic() - t_all, 1)
    write_result(a.out, res)
    s = res["eval"]
    print()
    print_table(
        ["step", "wall s"], [[k, res[f"{k}_s"]] for k in ("import", "sft", "eval", "grpo") if f"{k}_s" in res]
    )
    print(
        f"\nSFT: {res['sft']['demonstrations']} demos, {res['sft']['steps']} steps, final loss "
        f"{res['sft']['final_loss']:.3f}; eval pass@1 {s['pass@1']:.3f} on {a.eval_seeds} seeds "
        f"(goal >= 0.3); GRPO adapter non-zero: {res.get('grpo_adapter_nonzero', res.get('grpo_error'))}"
    )
    return 0


def _nonzero(path: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as t:
        return any(t.get_tensor(k).any() for k in t.keys() if "lora_B" in k)


if __name__ == "__main__":
    sys.exit(main())
