#!/usr/bin/env python
"""Compositions of a base's adapters on shop-mixed, per task family (issue 30's acceptance: return_item or exchange
raised over the base, no family more than 0.05 below it, router and moe, one adapter and several).

Given a store holding the adapters (e.g. those `calibrate_base.py --train-steps N` trained) and the diagnosis of the
base's shop-mixed conversations, it composes router and MoE of the first adapter alone and of all of them (the MoE
gates learn from the adapters' own training episodes and the diagnosed conversations, tested on the base's own
validation rollouts), evaluates each and the base on the validation seeds, and prints every family beside the
base's with the MoE's per-turn routing.

    OMP_NUM_THREADS=2 python benchmarks/shop_mixed_compositions.py --store S/store --diagnosis store://diagnosis/diag \\
        --adapters store://adapter/ID1,store://adapter/ID2 --out benchmarks/results/scratch/compositions.json
"""

from __future__ import annotations

import argparse
import sys

from common import REPO, write_result

EVAL = {"env": "shop-mixed", "max_new_tokens": 120, "max_turns": 16}


def families(summary) -> dict[str, float]:
    return {k: round(v["pass@1"], 3) for k, v in summary["families"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--base", default=str(REPO / "examples" / "shop-mixed-base-agent"))
    ap.add_argument("--diagnosis", required=True, help="the diagnosis of the base's shop-mixed conversations")
    ap.add_argument(
        "--adapters", required=True, help="adapter URIs, comma-separated (the first is composed alone)"
    )
    ap.add_argument("--seeds", default="600000:600100", help="validation seeds of shop-mixed")
    ap.add_argument("--moe-steps", type=int, default=150)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    st = Store(a.store)
    base = execute("model", {"source": a.base}, st).main.uri
    ev = {**EVAL, "seeds": a.seeds}
    base_ev = execute("eval", {"model": a.base, **ev}, st).outputs
    out = {"command": " ".join(sys.argv), "seeds": a.seeds, "base": families(base_ev["eval"].summary)}
    out["base_pass@1"] = base_ev["eval"].summary["pass@1"]
    adapters = a.adapters.split(",")
    for tag, chosen in (("one", adapters[:1]), ("all", adapters)):
        for method in ("router", "moe"):
            cfg = {"method": method, "base": base, "adapters": chosen, "seed": 0}
            if method == "moe":
                cfg["moe"] = {"target": "shop-mixed", "seeds": "350000:350008", "diagnosis": a.diagnosis}
                cfg["moe"] |= {
                    "test_rollouts": base_ev["rollouts"].uri,
                    "steps": a.moe_steps,
                    "max_turns": 16,
                }
            comp = execute("compose", cfg, st).main
            s = execute("eval", {"model": comp.uri, **ev}, st).outputs["eval"].summary
            keys = (
                "routing_accuracy",
                "routing_accuracy_per_expert",
                "routing_test_episodes",
                "generated_episodes",
            )
            row = {
                "pass@1": s["pass@1"],
                "families": families(s),
                "routing": {k: comp.summary.get(k) for k in keys},
            }
            row["below_base"] = {f: round(out["base"][f] - p, 3) for f, p in row["families"].items()
                                 if out["base"].get(f, 0) - p > 0.05}  # fmt: skip
            out[f"{method}-{tag}"] = row
            print(f"{method}-{tag}: pass@1 {s['pass@1']:.3f} (base {out['base_pass@1']:.3f})", flush=True)
            for f, p in row["families"].items():
                print(f"  {f:16s} {out['base'].get(f, 0):.3f} -> {p:.3f}", flush=True)
    if a.out:
        write_result(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
