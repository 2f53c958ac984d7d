"""`trace ingest tau2|jsonl FILE`: import rollouts into a `rollouts` artifact."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_outcome, info, print_table
from trace_cli.cli.options import Arg, StageOptions


@click.group(
    epilog=(
        "Examples:\n\n  trace ingest tau2 results_gpt-4.1_retail_test.json --name gpt41-retail\n\n"
        "  trace ingest jsonl episodes.jsonl --on-error skip\n\n"
        '  trace store sql "SELECT success, count(*) FROM episodes GROUP BY ALL"'
    )
)
def ingest():
    """Import rollouts into the store as a `rollouts` artifact (tables episodes and tool_calls)."""


def _stage_options(file_type) -> StageOptions:
    return StageOptions("ingest", Arg("file", "path", file_type), "--on-error", "--source")


TAU2 = _stage_options(click.Path())
JSONL = _stage_options(click.Path(dir_okay=False))
_OUTPUTS = (
    "Human alias for the artifact (usable as store://rollouts/NAME).",
    "Re-ingest even if an identical artifact exists.",
)


def _report(out, as_json):
    art = out.main
    again = f"{out.prepared.config['path']} was already ingested; use --force to redo"
    if echo_outcome(out, as_json, again, path=str(art.path)):
        return
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


@TAU2.command(
    "tau2",
    epilog="Example:\n\n  trace ingest tau2 examples/tau2/results_gpt-4.1_retail_test.json --name retail",
    outputs=_OUTPUTS,
    group=ingest,
    fixed={"format": "tau2"},
)
def tau2(out, as_json):
    """Read τ²-bench results into a rollouts artifact: a results JSON (info, tasks, simulations) or a per-run
    directory (results.json + simulations/<id>.json). Runs τ²-bench excludes from its metrics
    (infrastructure_error, no reward_info) are excluded, counted and listed in rejects.jsonl."""
    _report(out, as_json)


@JSONL.command(
    "jsonl",
    epilog=(
        "Example:\n\n  trace ingest jsonl my_agent.jsonl --name mine\n\n"
        'Each line: {"task_id": ..., "messages": [OpenAI chat messages with tool_calls], "reward": 1.0, '
        '"success": true, "tools": [...]} (schema: schemas/episode.v1.json).'
    ),
    outputs=_OUTPUTS,
    group=ingest,
    fixed={"format": "jsonl"},
)
def jsonl(out, as_json):
    """Read one episode per line (OpenAI chat messages + reward) into a rollouts artifact."""
    _report(out, as_json)
