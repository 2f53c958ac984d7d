"""`trace train`: SFT a base agent on demonstrations (with deficits), or (later) GRPO LoRA adapters."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace train --method sft --env shop --model store://model/small "
        "--deficit precondition_verification --deficit multi_step_completion --name base\n\n"
        "  trace train --config train.yaml --set epochs=2 --set lora.enabled=true\n\n"
        "Config keys are those of schemas/config/train.v1.json; --set KEY=VALUE overrides any of them."
    )
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config (kind: train).")
@click.option("--method", type=click.Choice(["sft"]), help="sft: supervised fine-tuning on demonstrations.")
@click.option("--env", help="Environment reference (shop, 'shop?families=a,b', store://environment/NAME).")
@click.option("--model", help="Model to start from (store://model/NAME or an HF dir).")
@click.option("--deficit", "deficits", multiple=True, help="Capability withheld from demonstrations (repeatable).")
@click.option("--seeds", help="Training seeds A:B (default 100000:103000).")
@click.option("--max-minutes", type=float, help="Stop training after this wall time.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--name", help="Alias for the output artifact.")
@click.option("--force", is_flag=True, help="Re-train even if an identical artifact exists.")
@json_option
@store_option
def train(config_file, method, env, model, deficits, seeds, max_minutes, overrides, name, force, as_json, store_dir):
    """Train a model. SFT writes a model artifact (full fine-tune, or LoRA merged with lora.enabled=true)."""
    from trace_cli.config.loading import apply_overrides, load_document
    from trace_cli.stages.base import execute

    cfg = dict(load_document(config_file) or {}) if config_file else {}
    for k, v in (("method", method), ("env", env), ("model", model), ("seeds", seeds), ("max_minutes", max_minutes)):
        if v is not None:
            cfg[k] = v
    if deficits:
        cfg["deficits"] = list(deficits)
    cfg, applied = apply_overrides(cfg, list(overrides))
    for a in applied:
        info(f"override {a['key']}: {a['old']!r} -> {a['new']!r}")
    for req in ("method", "env", "model"):
        if req not in cfg:
            from trace_cli.errors import UsageError

            raise UsageError(f"--{req} is required (or set it in --config)")
    out = execute("train", cfg, open_store(store_dir), name=name, overrides=applied, force=force)
    a = out.main
    if as_json:
        echo_json({"id": a.id, "uri": a.uri, "skipped": out.skipped, "summary": a.summary})
        return
    if out.skipped:
        info(f"up to date: {a.uri} (use --force to re-train)")
    s = a.summary
    print_table(["artifact", "method", "demos", "steps", "final loss", "train s"],
                [[a.uri, s.get("method"), s.get("demonstrations"), s.get("steps"), s.get("final_loss"), s.get("train_s")]])
