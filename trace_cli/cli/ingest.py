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
    print_table(
        ["artifact", "episodes", "successes", "failures", "tool_calls", "rejected"],
        [[art.uri, s["episodes"], s["successes"], s["failures"], s["tool_calls"], s["rejected"]]],
    )
    if s.get("rejected"):
        info(f"{s['rejected']} record(s) rejected; reasons in {art.path / 'rejects.jsonl'}")


@ingest.command(
    "tau2",
    epilog="Example:\n\n  trace ingest tau2 ../shared/data/tau2/results_gpt-4.1_retail_test.json --name retail",
)
@click.argument("file", type=click.Path(dir_okay=False))
@_options
def tau2(file, name, on_error, source, force, as_json, store_dir):
    """Read a τ²-bench results JSON (info, tasks, simulations) into a rollouts artifact."""
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
