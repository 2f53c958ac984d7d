#!/usr/bin/env python
"""MoE routing accuracy per held-out turn, per slot, on the demo (issue 30: >= 0.9 with >= 50 test conversations
per slot).

1. Runs `recipes/demo.yaml` up to the two GRPO adapters (precondition, multi-step; each keeps its training
   episodes), the diagnosis of the base agent's shop rollouts and the base agent's held-out shop rollouts
   (seeds 200:400) in `--store` (steps already there are skipped).
2. Composes the adapters as a token-level MoE with no moe.data, so the gates learn per-turn labels from the
   adapters' own positive-advantage training episodes and the diagnosed conversations (no rollouts generated),
   twice: `split` holds out conversations of those (by episode, moe.held_out / moe.held_out_min per slot);
   `agent` trains on all of them and tests on the base agent's own held-out shop conversations (moe.test_rollouts,
   labelled per turn by need).
3. Prints, per setting and slot, the turn accuracy, turns and held-out conversations; writes the JSON.

    OMP_NUM_THREADS=1 nice python benchmarks/moe_routing.py --store /tmp/demo-store [--steps 400]

Measured (2 busy cores, 1 thread; results/moe_routing.json, results/moe_routing_400.json): no rollout generated.
`split` (held-out: base 69, precondition 88, multi-step 56 conversations; the experts' held-out turns are mostly
their own training episodes): 150 steps 0.972 (base 0.956, precondition 0.976, multi-step 0.982), 400 steps
0.975. `agent` (the base agent's 200 held-out shop conversations: precondition 51, multi-step only 28 lack
them): 150 steps 0.844 (0.868 / 0.727 / 0.839), 400 steps 0.904 (0.922 / 0.813 / 0.911): below 0.9 for the
precondition turns of the target, and fewer than 50 multi-step conversations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import Stages, log, machine, print_table, write_result

ROOT = Path(__file__).resolve().parents[1]

PREREQUISITES = ("train_precondition", "train_multistep", "diagnose", "base_eval_heldout")


def _prerequisites(store: str) -> None:
    from trace_cli.recipes.model import load_recipe
    from trace_cli.recipes.runner import run_recipe
    from trace_cli.store import Store

    recipe = load_recipe(ROOT / "recipes" / "demo.yaml")
    for step in PREREQUISITES:
        log(f"demo recipe up to {step}")
        run_recipe(recipe, Store(store), to=step)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--store", required=True, help="store directory (the demo's artifacts are built or reused)"
    )
    ap.add_argument("--steps", type=int, default=150, help="gate training steps (the demo's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "moe_routing.json"))
    args = ap.parse_args()
    _prerequisites(args.store)
    st = Stages(args.store)
    adapters = ["store://adapter/demo-adapter-precondition", "store://adapter/demo-adapter-multistep"]
    base = {"target": "shop", "diagnosis": "store://diagnosis/demo-diagnosis", "steps": args.steps}
    settings = {
        "split": base,
        "agent": {**base, "test_rollouts": "store://rollouts/demo-base-heldout-eval"},
    }
    results, rows = {}, []
    for label, moe in settings.items():
        cfg = {"method": "moe", "base": "store://model/demo-base", "adapters": adapters, "moe": moe}
        s = st.run(f"moe-{label}", "compose", cfg).main.summary
        results[label] = {k: v for k, v in s.items() if not k.startswith("base_model")}
        convs = s.get("routing_test_conversations_per_expert") or {}
        for slot, acc in s["routing_accuracy_per_expert"].items():
            rows.append([label, slot, acc, s["routing_turns_per_expert"][slot], convs.get(slot)])
        rows.append(
            [label, "all", s["routing_accuracy"], s["routing_turns"], s["routing_test_conversations"]]
        )
    print_table(["setting", "slot", "turn accuracy", "turns", "held-out conversations"], rows)
    doc = {"machine": machine("torch", "transformers"), "settings": settings, "results": results}
    doc["timings_s"] = st.timings
    log(f"wrote {write_result(args.out, doc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
