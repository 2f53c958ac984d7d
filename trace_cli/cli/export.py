"""`trace export tau2|jsonl ROLLOUTS --out FILE`: write a rollouts artifact in τ²-bench's or OpenAI's format.

Not a stage: its output is a file for other tools, not an artifact, so there is nothing to id, cache,
index or chain in a recipe; it reads the store and writes one file atomically (nothing on error).
"""

from __future__ import annotations

import json

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, store_option


@click.group(
    epilog=(
        "Examples:\n\n  trace export tau2 store://rollouts/retail --out results_retail.json\n\n"
        "  trace export jsonl store://rollouts/NAME --out episodes.jsonl\n\n"
        "Ingesting an export gives back the same episodes, successes and tool calls."
    )
)
def export():
    """Write a rollouts artifact as τ²-bench results JSON or OpenAI-format JSONL."""


def _options(f):
    f = click.argument("rollouts")(f)
    f = click.option("--out", required=True, type=click.Path(), help="File to write.")(f)
    f = click.option("--force", is_flag=True, help="Overwrite --out if it exists.")(f)
    f = json_option(f)
    return store_option(f)


def _load(store_dir, rollouts, out, force):
    from trace_cli.formats import check_out
    from trace_cli.store.rollouts import read_episodes

    path = check_out(out, force=force)
    art = open_store(store_dir).resolve(rollouts, kind="rollouts")
    return art, read_episodes(art.path), path


def _report(art, path, counts, as_json):
    if as_json:
        echo_json({"rollouts": art.uri, "out": str(path), **counts})
        return
    info(f"wrote {path} from {art.uri}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if counts.get("skipped"):
        info(f"{counts['skipped']} episode(s) without a reward were left out (they cannot be scored)")
    if counts.get("lossy_arguments"):
        info(
            f"{counts['lossy_arguments']} tool call(s) had arguments that are not a JSON object: written as {{}}"
        )


@export.command(
    "tau2",
    epilog=(
        "Example:\n\n  trace export tau2 store://rollouts/NAME --out results.json\n\n"
        "The file is τ²-bench's Results JSON (info, tasks, simulations with messages and reward_info); "
        "`tau2 view` and `trace ingest tau2` read it."
    ),
)
@_options
def tau2(rollouts, out, force, as_json, store_dir):
    """Write τ²-bench's results JSON from any rollouts artifact (eval, ingest)."""
    from trace_cli import __version__
    from trace_cli.formats import tau2 as fmt
    from trace_cli.formats import write_atomic

    art, eps, path = _load(store_dir, rollouts, out, force)
    cfg = art.config
    doc, counts = fmt.results(
        eps,
        created_at=art.manifest.get("created_at"),
        agent=cfg.get("model") if art.manifest.get("stage") == "eval" else None,
        max_steps=cfg.get("max_turns"),
        version=__version__,
    )
    write_atomic(path, lambda f: json.dump(doc, f, ensure_ascii=False, indent=2))
    if doc.get("info", {}).get("user_info", {}).get("implementation") == fmt.SCRIPTED_USER:
        click.echo(
            "note: these episodes ran with trace's scripted user (user=scripted), not τ²-bench's user simulator: "
            "the file says so (info.user_info) and its rewards are not τ²-bench scores",
            err=True,
        )
    _report(art, path, counts, as_json)


@export.command(
    "jsonl",
    epilog=(
        "Example:\n\n  trace export jsonl store://rollouts/NAME --out episodes.jsonl\n\n"
        "One episode per line (schemas/episode.v1.json), as `trace ingest jsonl` reads it."
    ),
)
@_options
def jsonl(rollouts, out, force, as_json, store_dir):
    """Write one OpenAI-format episode per line (messages with tool_calls, reward, success, tools)."""
    from trace_cli.formats import jsonl as fmt
    from trace_cli.formats import write_atomic

    art, eps, path = _load(store_dir, rollouts, out, force)
    lines, counts = fmt.lines(eps)
    write_atomic(path, lambda f: f.writelines(line + "\n" for line in lines))
    _report(art, path, counts, as_json)
