"""`trace ingest tau2|jsonl FILE`: import rollouts into a `rollouts` artifact."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.group(
    epilog=(
        "Examples:\n\n  trace ingest tau2 results_gpt-4.1_retail_test.json --name gpt41-retail\n\n"
        "  trace ingest jsonl episodes.jsonl --on-error skip\n\n"
        '  trace store sql "SELECT success, count(*) FROM episodes GROUP BY ALL"'
    )
)
def ingest():
    """Import rollouts into the store as a `rollouts` artifact (tables episodes and tool_calls)."""


def _options(f):
    f = click.option("--name", help="Human alias for the artifact (usable as store://rollouts/NAME).")(f)
    f = click.option(
        "--on-error",
        type=click.Choice(["fail", "skip"]),
        default="fail",
        show_default=True,
        help="fail: any bad record aborts and nothing is written; skip: write good records + rejects.jsonl.",
    )(f)
    f = click.option("--source", help="Label stored in episodes.source (default: the file name).")(f)
    f = click.option("--force", is_flag=True, help="Re-ingest even if an identical artifact exists.")(f)
    f = json_option(f)
    return store_option(f)


def _run(fmt, file, name, on_error, source, force, as_json, store_dir):
    from trace_cli.stages.base import execute

    st = open_store(store_dir)
    cfg = {"format": fmt, "path": file, "on_error": on_error}
    if source:
        cfg["source"] = source
    out = execute("ingest", cfg, st, name=name, force=force)
    art = out.main
    if as_json:
        echo_json(
            {
                "id": art.id,
                "kind": art.kind,
                "uri": art.uri,
                "path": str(art.path),
                "skipped": out.skipped,
                "summary": art.summary,
            }
        )
        return
    if out.skipped:
        info(f"up to date: {file} was already ingested as {art.uri} (use --force to redo)")
    s = art.summary
    ks = sorted(s.get("pass^k") or {}, key=int)
    print_table(
        ["artifact", "episodes", "successes", "failures", "tool_calls", "rejected", "excluded", "pass@1"]
        + [f"pass^{k}" for k in ks],
        [
            [art.uri, s["episodes"], s["successes"], s["failures"], s["tool_calls"], s["rejected"]]
            + [s.get("excluded", 0), s.get("pass@1")]
            + [s["pass^k"][k] for k in ks]
        ],
    )
    if s.get("rejected") or s.get("excluded"):
        info(
            f"{s['rejected']} rejected, {s.get('excluded', 0)} excluded; reasons in {art.path / 'rejects.jsonl'}"
        )
    if s.get("derived_task_ids"):
        info(
            f"{s['derived_task_ids']} run(s) had no task_id: derived from the first user message (info.task_id_derived)"
        )


@ingest.command(
    "tau2",
    epilog="Example:\n\n  trace ingest tau2 examples/tau2/results_gpt-4.1_retail_test.json --name retail",
)
@click.argument("file", type=click.Path())
@_options
def tau2(file, name, on_error, source, force, as_json, store_dir):
    """Read τ²-bench results into a rollouts artifact: a results JSON (info, tasks, simulations) or a per-run
    directory (results.json + simulations/<id>.json). Runs τ²-bench excludes from its metrics
    (infrastructure_error, no reward_info) are excluded, counted and listed in rejects.jsonl."""
    _run("tau2", file, name, on_error, source, force, as_json, store_dir)


@ingest.command(
    "jsonl",
    epilog=(
        "Example:\n\n  trace ingest jsonl my_agent.jsonl --name mine\n\n"
        'Each line: {"task_id": ..., "messages": [OpenAI chat messages with tool_calls], "reward": 1.0, '
        '"success": true, "tools": [...]} (schema: schemas/episode.v1.json).'
    ),
)
@click.argument("file", type=click.Path(dir_okay=False))
@_options
def jsonl(file, name, on_error, source, force, as_json, store_dir):
    """Read one episode per line (OpenAI chat messages + reward) into a rollouts artifact."""
    _run("jsonl", file, name, on_error, source, force, as_json, store_dir)
