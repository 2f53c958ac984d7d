"""`trace diagnose`: find the capabilities whose absence separates failed from successful rollouts."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace diagnose --rollouts store://rollouts/base-eval\n\n"
        "  trace diagnose --rollouts store://rollouts/tau2-retail --runs 10 --min-runs 8 --json\n\n"
        "  trace diagnose --rollouts r --analyst openai --base-url http://127.0.0.1:8000/v1 --llm-model qwen "
        "--candidates discover\n\n"
        "A capability is kept when coverage >= 0.10 and delta = ER- - ER+ >= 0.20 in >= K of N runs."
    )
)
@click.option("--rollouts", required=True, help="Rollouts artifact to analyse (ingested or from trace eval).")
@click.option("--analyst", type=click.Choice(["rules", "openai", "hf"]), default="rules", show_default=True)
@click.option(
    "--candidates",
    default="catalog",
    show_default=True,
    help="catalog, discover, or a capabilities YAML file.",
)
@click.option("--capability", "capabilities", multiple=True, help="Only these candidates (repeatable).")
@click.option("--runs", type=int, default=10, show_default=True, help="N independent labelling runs.")
@click.option("--min-runs", type=int, default=8, show_default=True, help="K: runs a capability must pass.")
@click.option("--coverage-min", type=float, default=0.10, show_default=True, help="rho.")
@click.option("--delta-min", type=float, default=0.20, show_default=True, help="delta.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-episodes", type=int, help="Label at most this many episodes (stratified).")
@click.option("--base-url", help="openai analyst: the server's base URL (…/v1).")
@click.option("--llm-model", help="openai: model name on the server; hf: a local model reference.")
@click.option(
    "--api-key-env", help="openai: env var holding the API key (default OPENAI_API_KEY); never stored."
)
@click.option("--temperature", type=float, help="LLM analysts' sampling temperature (default 0.7).")
@click.option("--concurrency", type=int, help="openai: concurrent requests (default 8).")
@click.option("--name", help="Alias for the diagnosis artifact.")
@click.option("--force", is_flag=True, help="Re-run even if an identical diagnosis exists.")
@json_option
@store_option
def diagnose(
    rollouts,
    analyst,
    candidates,
    capabilities,
    runs,
    min_runs,
    coverage_min,
    delta_min,
    seed,
    max_episodes,
    base_url,
    llm_model,
    api_key_env,
    temperature,
    concurrency,
    name,
    force,
    as_json,
    store_dir,
):
    """Contrastive capability analysis: label, aggregate over runs, select (writes a diagnosis artifact)."""
    from trace_cli.config.loading import load_artifact_yaml
    from trace_cli.stages.base import execute

    cfg = {
        "rollouts": rollouts,
        "analyst": analyst,
        "candidates": candidates,
        "runs": runs,
        "min_runs": min_runs,
        "coverage_min": coverage_min,
        "delta_min": delta_min,
        "seed": seed,
    }
    if capabilities:
        cfg["capabilities"] = list(capabilities)
    if max_episodes:
        cfg["max_episodes"] = max_episodes
    llm = {
        k: v
        for k, v in (
            ("base_url", base_url),
            ("model", llm_model),
            ("api_key_env", api_key_env),
            ("temperature", temperature),
            ("concurrency", concurrency),
        )
        if v is not None
    }
    if llm:
        cfg["llm"] = llm
    out = execute("diagnose", cfg, open_store(store_dir), name=name, force=force)
    a = out.main
    doc = load_artifact_yaml(a.path / "capabilities.yaml")
    if as_json:
        echo_json({"id": a.id, "uri": a.uri, "skipped": out.skipped, **doc})
        return
    if out.skipped:
        info(f"up to date: {a.uri}")
    rows = []
    for status, items in (("SELECTED", doc["selected"]), ("rejected", doc["rejected"])):
        for c in items:
            rows.append(
                [
                    status,
                    c["name"],
                    f"{c['mean_delta']:+.3f} ± {c['std_delta']:.3f}",
                    f"{c['mean_coverage']:.3f}",
                    f"{c['runs_passed']}/{c['runs_total']}",
                    ", ".join(c.get("example_failed_task_ids", [])[:3]),
                ]
            )
    print_table(
        ["", "capability", "delta", "coverage", "runs passed", "example failed tasks"],
        rows,
        title=f"diagnosis of {doc['rollouts']} ({doc['episodes']['failed']} failed, {doc['episodes']['passed']} passed)",
    )
    info(f"diagnosis: {a.uri}")
