"""`trace diagnose`: find the capabilities whose absence separates failed from successful rollouts."""

from __future__ import annotations

from trace_cli.cli.common import echo_json, info, print_table
from trace_cli.cli.options import Flag, StageOptions

DIAGNOSE = StageOptions(
    "diagnose",
    "--rollouts",
    "--analyst",
    "--candidates",
    Flag("--capability", "capabilities"),
    "--runs",
    "--min-runs",
    "--coverage-min",
    "--delta-min",
    "--seed",
    "--max-episodes",
    Flag("--base-url", "llm.base_url"),
    Flag("--llm-model", "llm.model"),
    Flag("--api-key-env", "llm.api_key_env"),
    Flag("--temperature", "llm.temperature"),
    Flag("--concurrency", "llm.concurrency"),
)


@DIAGNOSE.command(
    epilog=(
        "Examples:\n\n  trace diagnose --rollouts store://rollouts/base-eval\n\n"
        "  trace diagnose --rollouts store://rollouts/tau2-retail --runs 10 --min-runs 8 --json\n\n"
        "  trace diagnose --rollouts r --analyst openai --base-url http://127.0.0.1:8000/v1 --llm-model qwen "
        "--candidates discover\n\n"
        f"A capability is kept when coverage >= {DIAGNOSE.default('coverage_min')} and delta = ER- - ER+ >= "
        f"{DIAGNOSE.default('delta_min')} in >= K of N runs (--coverage-min, --delta-min, --min-runs, --runs)."
    ),
    outputs=("Alias for the diagnosis artifact.", "Re-run even if an identical diagnosis exists."),
)
def diagnose(out, as_json):
    """Contrastive capability analysis: label, aggregate over runs, select (writes a diagnosis artifact)."""
    from trace_cli.config.loading import load_artifact_yaml

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
