"""`trace model init|show`: build offline tiny Qwen3 models; inspect a model reference."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.group(
    epilog="Example:\n\n  trace model init --preset tiny --name tiny\n\n  trace model show store://model/tiny"
)
def model():
    """Build and inspect models. References: store://model/NAME, a local HF dir, a hub id, policy:reference."""


@model.command("init", epilog="Example:\n\n  trace model init --preset small --name base --seed 0")
@click.option("--preset", type=click.Choice(["tiny", "small"]), default="tiny", show_default=True)
@click.option("--name", help="Alias for the artifact (store://model/NAME).")
@click.option("--seed", type=int, default=0, show_default=True, help="Weight init and corpus seed.")
@click.option(
    "--env", "envs", multiple=True, help="Environment(s) whose text trains the tokenizer (default: shop)."
)
@click.option(
    "--corpus-seeds", type=int, help="Episodes per environment in the tokenizer corpus (default 300)."
)
@click.option("--force", is_flag=True, help="Rebuild even if an identical artifact exists.")
@json_option
@store_option
def init(preset, name, seed, envs, corpus_seeds, force, as_json, store_dir):
    """Build a Qwen3-architecture causal LM + byte-level BPE tokenizer offline, as a model artifact."""
    from trace_cli.stages.base import execute

    cfg = {"preset": preset, "seed": seed}
    if envs:
        cfg["envs"] = list(envs)
    if corpus_seeds is not None:  # 0 must reach validation (and fail there), not silently mean the default
        cfg["corpus_seeds"] = corpus_seeds
    out = execute("model", cfg, open_store(store_dir), name=name, force=force)
    a = out.main
    if as_json:
        echo_json(
            {
                "id": a.id,
                "uri": a.uri,
                "path": str(a.path / "hf"),
                "skipped": out.skipped,
                "summary": a.summary,
            }
        )
        return
    if out.skipped:
        info(f"up to date: {a.uri}")
    print_table(
        ["model", "preset", "parameters", "vocab", "transcript tokens"],
        [
            [
                a.uri,
                a.summary["preset"],
                a.summary["parameters"],
                a.summary["vocab_size"],
                a.summary["mean_transcript_tokens"],
            ]
        ],
    )


@model.command("show", epilog="Example:\n\n  trace model show store://model/base --json")
@click.argument("ref")
@json_option
@store_option
def show(ref, as_json, store_dir):
    """Resolve a model reference and print what it points to (no weights loaded)."""
    from trace_cli.models.refs import resolve_model

    r = resolve_model(ref, open_store(store_dir))
    doc = {
        "ref": ref,
        "kind": r.kind,
        "path": str(r.path) if r.path else None,
        "adapter_path": str(r.adapter_path) if r.adapter_path else None,
        "digest": r.digest,
        **r.extra,
    }
    if as_json:
        echo_json(doc)
    else:
        print_table(list(doc), [list(doc.values())])
