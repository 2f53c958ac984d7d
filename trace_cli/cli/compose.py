"""`trace compose`: combine capability adapters into one composition (router, moe, merge)."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace compose --method router --base store://model/base "
        "--adapter store://adapter/precondition --adapter store://adapter/multistep --name demo-router\n\n"
        "  trace compose --method moe --adapter store://adapter/precondition --adapter store://adapter/multistep "
        "--name demo-moe --set moe.steps=200\n\n"
        "  trace compose --method moe ... --data precondition_verification=store://rollouts/pre-eval "
        "--data base=store://rollouts/shop-eval   (label transcripts yourself)\n\n"
        "  trace compose --method merge ... --name demo-merge\n\n"
        "  trace eval --model store://composition/demo-moe --env shop --seeds 0:100\n\n"
        "Config keys are those of schemas/config/compose.v1.json; --set KEY=VALUE overrides any of them."
    )
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config (kind: compose).")
@click.option(
    "--method",
    type=click.Choice(["router", "moe", "merge"]),
    help="router: per-conversation zero-shot router (paper); moe: token-level top-1 gates; merge: linear merge.",
)
@click.option(
    "--base", help="Base model (default: the adapters' own base); every adapter must be trained on it."
)
@click.option(
    "--adapter", "adapters", multiple=True, help="Adapter artifact (store://adapter/NAME), repeatable, >= 2."
)
@click.option(
    "--data",
    "data",
    multiple=True,
    metavar="EXPERT=ROLLOUTS",
    help="[moe] Transcripts for gate training: a capability (or 'base') and a rollouts artifact (repeatable).",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable)."
)
@click.option("--name", help="Alias for the composition artifact.")
@click.option("--force", is_flag=True, help="Rebuild even if an identical artifact exists.")
@json_option
@store_option
def compose(config_file, method, base, adapters, data, overrides, name, force, as_json, store_dir):
    """Combine per-capability LoRA adapters into one model: evaluate it with --model store://composition/NAME."""
    from trace_cli.config.loading import apply_overrides, load_document
    from trace_cli.errors import UsageError
    from trace_cli.stages.base import execute

    cfg = dict(load_document(config_file) or {}) if config_file else {}
    if method:
        cfg["method"] = method
    if base:
        cfg["base"] = base
    if adapters:
        cfg["adapters"] = list(adapters)
    if data:
        items = []
        for d in data:
            expert, sep, ref = d.partition("=")
            if not sep or not expert or not ref:
                raise UsageError(
                    f"--data {d!r}: expected EXPERT=ROLLOUTS, e.g. base=store://rollouts/shop-eval"
                )
            items.append({"expert": expert, "rollouts": ref})
        cfg.setdefault("moe", {})["data"] = items
    cfg, applied = apply_overrides(cfg, list(overrides))
    for a in applied:
        info(f"override {a['key']}: {a['old']!r} -> {a['new']!r}")
    for req, flag in (("method", "--method"), ("adapters", "--adapter")):
        if req not in cfg:
            raise UsageError(f"{flag} is required (or set {req} in --config)")
    out = execute("compose", cfg, open_store(store_dir), name=name, overrides=applied, force=force)
    a = out.main
    if as_json:
        echo_json({"id": a.id, "uri": a.uri, "kind": a.kind, "skipped": out.skipped, "summary": a.summary})
        return
    if out.skipped:
        info(f"up to date: {a.uri} (use --force to rebuild)")
    s = a.summary
    row = [a.uri, s.get("method"), ", ".join(s.get("experts", []))]
    cols = ["artifact", "method", "experts"]
    if s.get("method") == "moe":
        per = s.get("routing_accuracy_per_expert") or {}
        cols += ["routing accuracy", "per expert", "held-out turns"]
        row += [
            s.get("routing_accuracy"),
            ", ".join(f"{k} {v}" for k, v in per.items()),
            s.get("routing_turns"),
        ]
    elif s.get("method") == "router":
        cols += ["strategy", "reroute"]
        row += [f"{s.get('strategy')} (p {s.get('top_p')})", s.get("reroute")]
    else:
        cols += ["combination", "weights"]
        row += [s.get("combination_type"), s.get("weights")]
    print_table(cols, [row])
