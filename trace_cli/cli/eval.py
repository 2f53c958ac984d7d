"""`trace eval`: run any model (base, adapter, built-in policy) on any environment."""

from __future__ import annotations

from trace_cli.cli.common import echo_json, info, print_table
from trace_cli.cli.options import StageOptions

EVAL = StageOptions(
    "eval",
    "--model",
    "--env",
    "--seeds",
    "--trials",
    "--temperature",
    "--top-p",
    "--max-turns",
    "--max-new-tokens",
    "--batch-size",
    "--seed",
)


@EVAL.command(
    "eval",
    epilog=(
        "Examples:\n\n  trace eval --model store://model/base --env shop --seeds 0:200\n\n"
        "  trace eval --model policy:reference --env 'shop?families=cancel_order' --seeds 0:50\n\n"
        "  trace eval --model store://adapter/precondition --env store://environment/precondition "
        "--seeds 1000:1100 --trials 4 --temperature 1.0\n\n"
        "  trace eval --model 'openai:http://127.0.0.1:8000/v1?model=base' --env shop --seeds 0:50\n\n"
        "Writes a rollouts artifact (episodes, tool_calls) and an eval artifact (pass@1, pass^k, families)."
    ),
    outputs=("Alias for the rollouts and eval artifacts.", "Re-run even if an identical evaluation exists."),
)
def eval_cmd(out, as_json):
    """Evaluate a model on an environment: rollouts + mean reward, pass@1, pass^k, per task family."""
    cfg, ev = out.prepared.config, out.outputs["eval"]
    s = ev.summary
    if as_json:
        echo_json(
            {"eval": ev.uri, "rollouts": out.outputs["rollouts"].uri, "skipped": out.skipped, "summary": s}
        )
        return
    if out.skipped:
        info(f"up to date: {ev.uri} (use --force to re-run)")
    ks = sorted(s["pass^k"], key=int)
    cols = ["family", "tasks", "episodes", "mean reward", "pass@1"] + [f"pass^{k}" for k in ks]
    rows = [
        [f, v["tasks"], v["episodes"], v["mean_reward"], v["pass@1"]] + [v["pass^k"][k] for k in ks]
        for f, v in s["families"].items()
    ]
    rows.append(
        ["ALL", s["tasks"], s["episodes"], s["mean_reward"], s["pass@1"]] + [s["pass^k"][k] for k in ks]
    )
    print_table(cols, rows, title=f"{cfg['model']} on {cfg['env']}")
    info(f"rollouts: {out.outputs['rollouts'].uri}   eval: {ev.uri}")
