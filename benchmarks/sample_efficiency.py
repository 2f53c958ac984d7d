#!/usr/bin/env python
"""Sample efficiency (issues 16 and 23, the paper's headline): TRACE vs GRPO-on-target vs base at equal rollouts.

Targets: `shop-mixed` (τ²-bench's task structure: 1-4 requests per conversation, all-or-nothing; the target the
paper's claim is about) and `shop` (one capability per task family). From one base agent (default:
examples/shop-mixed-base-agent; `--base examples/demo-base-agent --env-tools needed` for `shop`), at every budget B:
- base:        the base agent, untrained;
- grpo_target: a GRPO LoRA adapter trained on the target with B rollouts;
- TRACE:       diagnose D of the base agent's own target rollouts; synthesize and calibrate one environment per
               selected capability on the base agent itself (a sequential test over up to 32 seeds x 8; a
               calibration that fails is skipped and charged the rollouts it ran); train one GRPO adapter per
               environment, whose first steps reuse the calibration's on-policy episodes (paid once); compose them:
               `moe` (ours, the headline `trace` column: token-level gates trained on the diagnosed conversations,
               each labelled with the expert whose capability it lacks, and the experts' own environments),
               `router` (the paper's) and `merge` (the consolidation ablation, largest budget).
Two accountings, side by side: **all** — every rollout counts (diagnosis, calibration, the MoE's expert
transcripts, GRPO), the spend is checked against B, and a row whose spend exceeds it is marked and left out of
the ratio; **training** — only training rollouts count (GRPO's, the reused calibration episodes among them), as
the paper counts, with the fixed cost on top (reported). One GRPO run per method, environment and training seed
gives every budget (`snapshot_steps`; lr_scheduler constant, so a snapshot after k steps is what a k-step run
trains). Every method is measured on the same held-out test seeds (never used by any training, diagnosis,
calibration or choice); `single_best` (the best single adapter, an ablation) is chosen on a disjoint validation
range, and its validation rollouts are charged to it. TRACE is the MoE, decided in advance (no best-of
compositions). Routing accuracy of the MoE gates is measured on the base agent's own held-out conversations.

Prints tables and writes JSON: `targets.<target>.budgets` rows (rollouts, base, grpo_target, trace, router, moe,
merge, single_best, the `_train` columns of the training accounting, spent, grpo_constant_groups, gain_ratio),
the paired bootstrap per budget (`targets.<target>.bootstrap`: test tasks and training seeds resampled together;
TRACE gain - GRPO gain with its 90 % lower bound, the gain ratio with its 95 % interval), per-family pass@1 at the
largest budget, the ablation, every run with every method's per-task outcomes (`tasks_<method>`), the commit, the
dirty flag, the command and the settings. The library is `benchmarks/se/`; each file it writes is checked against
its schema in `benchmarks/schemas/` when written and when read. `--combine` refuses a run from a dirty checkout
(exit 2), keeps every file's commit and dirty flag (`sources`) and names the checkout that combined them
(`combined_by`). A process started again over its OUT.partial.json logs the restart (`restarts`: when, commit,
whether it resumed, `--restart-reason`).

    python benchmarks/sample_efficiency.py --quick --target shop-mixed   # 1 seed, 2 small budgets, 100 test seeds
    # the full run, one process per target, training seed and method (one per core), combined at the end; a
    # process that is stopped resumes when started again with the same command: the units it finished from
    # OUT.partial.json, its GRPO run from the last checkpoint in the same --store
    for s in 0 1 2; do OMP_NUM_THREADS=1 nohup python benchmarks/sample_efficiency.py --target shop-mixed \\
        --train-seeds $s --methods trace --store stores/mixed-$s \\
        --out benchmarks/results/scratch/se-mixed-trace-$s.json > se-mixed-trace-$s.log 2>&1 & done
    python benchmarks/sample_efficiency.py --combine benchmarks/results/scratch/se-mixed-*.json \\
        --out benchmarks/results/sample_efficiency_mixed.json

The learning rate (the same small sweep for both methods, on validation seeds: `se/sweep.py`): one `--lr-sweep`
process per method and rate, measured on `--validation` (never the test seeds), then the runs take each
method's best rate with `--learning-rate-from`, which records the sweep and its cost in the result:
    for lr in 1e-3 2e-3 4e-3; do for m in grpo_target trace; do OMP_NUM_THREADS=1 nohup python \\
        benchmarks/sample_efficiency.py --lr-sweep --target shop-mixed --budgets 2560 --train-seeds 100 \\
        --methods $m --learning-rate $lr --store stores/sweep-$m-$lr \\
        --out benchmarks/results/scratch/lr-$m-$lr.json > lr-$m-$lr.log 2>&1 & done; done
    python benchmarks/sample_efficiency.py ... --learning-rate-from benchmarks/results/scratch/lr-*.json
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from common import at_start, command
from se import freeze, output
from se.measure import Bench
from se.methods import run_grpo_target, run_trace
from se.results import Progress, Refused, combine, write
from se.settings import Settings, parse_settings
from se.stats import summarize
from se.sweep import apply as apply_sweep

TRAINED = {"grpo_target": run_grpo_target, "trace": run_trace}


def main(argv: list[str] | None = None) -> int:
    s = parse_settings(argv, __doc__)
    try:
        s = apply_sweep(s)
        registered = freeze.check(s.preregistered, s) if s.preregistered and not s.combine else None
        if s.combine:
            c = combine(list(s.combine))
            return finish(s, c["runs"], c["meta"], c["wall_s"], c["timings_s"])
        return run(s, registered)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(s: Settings, registered: dict[str, Any] | None = None) -> int:
    """Every target, training seed and method of the settings in one store; each finished (target, seed,
    method) is kept in OUT.partial.json, which a rerun of the same command resumes from."""
    import tempfile

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    store_dir = s.store or Path(tempfile.mkdtemp(prefix="sample-eff-"))
    b = Bench(store_dir, s.max_new_tokens)
    t0 = time.monotonic()
    meta = {
        **at_start(),  # the checkout this process started from
        "command": command(),
        "quick": s.quick,
        "held_out": s.held_out,
        "train_seeds": list(s.train_seeds),
        "targets_run": list(s.targets),
        "methods": list(s.methods),
        "settings": s.record(),
        "store": str(store_dir),
        **({"lr_sweep": s.lr_sweep} if s.lr_sweep else {}),
        **({"preregistration": registered} if registered else {}),
    }
    progress = Progress(s.out.with_suffix(".partial.json"), meta, s.restart_reason)
    base = b.run("base/import", "model", {"source": s.base}).outputs["model"].uri
    runs: list[dict[str, Any]] = []
    for target in s.targets:
        tgt = s.target(target)
        base_ev = b.eval(
            f"{target}/base/eval", base, tgt.test_env, s.held_out_of(target), max_turns=tgt.max_turns
        )
        for seed in s.train_seeds:
            rows = {B: {"target": target, "budget": B, "seed": seed} for B in s.budgets}
            for B in s.budgets:
                rows[B].update(
                    base=base_ev["pass@1"], families_base=base_ev["families"], tasks_base=base_ev["tasks"]
                )
            for method in s.methods:
                args = (b, s, target, base, seed, *((base_ev,) if method == "trace" else ()))
                per_budget = progress.unit(target, seed, method, TRAINED[method], *args)
                for B in s.budgets:
                    rows[B].update(per_budget[B])
            runs.extend(rows.values())
    meta.pop("targets_run")
    finish(s, runs, meta, round(time.monotonic() - t0, 1), b.timings)
    progress.finished()
    return 0


def finish(s: Settings, runs, meta, wall, timings) -> int:
    """The result document (checked against its schema), written; its tables printed; the plot."""
    targets = summarize(runs)
    res = {"benchmark": "sample_efficiency", **meta, "trace_is": "moe", "targets": targets, "runs": runs}
    if meta.get("preregistration"):  # the registered decision, applied
        res["verdict"] = freeze.verdict(meta["preregistration"], targets)
    write(s.out, {**res, "timings_s": timings, "wall_s": wall})
    output.plot(targets, s.plot)
    if meta.get("lr_sweep"):
        output.print_lr_sweep(meta["lr_sweep"])
    for target, t in targets.items():
        output.print_target(target, t)
    if res.get("verdict"):
        output.print_verdict(res["verdict"])
    print(f"\nJSON: {s.out}   plot: {s.plot}   wall {wall} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
