"""`trace eval`: run any model (base, adapter, built-in policy) on any environment."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    "eval",
    epilog=(
        "Examples:\n\n  trace eval --model store://model/base --env shop --seeds 0:200\n\n"
        "  trace eval --model policy:reference --env 'shop?families=cancel_order' --seeds 0:50\n\n"
        "  trace eval --model store://adapter/precondition --env store://environment/precondition "
        "--seeds 1000:1100 --trials 4 --temperature 1.0\n\n"
        "  trace eval --model 'openai:http://127.0.0.1:8000/v1?model=base' --env shop --seeds 0:50\n\n"
        "Writes a rollouts artifact (episodes, tool_calls) and an eval artifact (pass@1, pass^k, families)."
    ),
)
@click.option(
    "--model",
    required=True,
    help="store://model/NAME, store://adapter/NAME, HF dir, hub id, policy:reference, policy:random, "
    "or an OpenAI-compatible endpoint 'openai:http://HOST:PORT/v1?model=NAME' (key from $OPENAI_API_KEY).",
)
@click.option(
    "--env", required=True, help="Registered env (shop, 'shop?families=a,b') or store://environment/NAME."
)
@click.option("--seeds", default="0:100", show_default=True, help="Seed range A:B (B exclusive).")
@click.option(
    "--trials", type=int, default=1, show_default=True, help="Rollouts per seed (pass^k uses k <= trials)."
)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-turns", type=int, default=12, show_default=True, help="Agent actions per episode.")
@click.option("--max-new-tokens", type=int, default=160, show_default=True, help="Tokens per assistant turn.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Episodes generated together.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--name", help="Alias for the rollouts and eval artifacts.")
@click.option("--force", is_flag=True, help="Re-run even if an identical evaluation exists.")
@json_option
@store_option
def eval_cmd(
    model,
    env,
    seeds,
    trials,
    temperature,
    top_p,
    max_turns,
    max_new_tokens,
    batch_size,
    seed,
    name,
    force,
    as_json,
    store_dir,
):
    """Evaluate a model on an environment: rollouts + mean reward, pass@1, pass^k, per task family."""
    from trace_cli.stages.base import execute

    cfg = {
        "model": model,
        "env": env,
        "seeds": seeds,
        "trials": trials,
        "temperature": temperature,
        "top_p": top_p,
        "max_turns": max_turns,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "seed": seed,
    }
    out = execute("eval", cfg, open_store(store_dir), name=name, force=force)
    ev = out.outputs["eval"]
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
    print_table(cols, rows, title=f"{model} on {env}")
    info(f"rollouts: {out.outputs['rollouts'].uri}   eval: {ev.uri}")
