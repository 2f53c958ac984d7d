"""`trace train`: SFT a base agent on demonstrations (with deficits), or a GRPO LoRA adapter on an environment."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace train --method sft --env shop --model store://model/small "
        "--deficit precondition_verification --deficit multi_step_completion --name base\n\n"
        "  trace train --method grpo --env store://environment/precondition --model store://model/base "
        "--name precondition --set max_steps=20\n\n"
        "  trace train --method grpo --env shop --model store://model/base --name grpo-target   "
        "(the 'GRPO on target' baseline)\n\n"
        "  trace train --config train.yaml --resume   (continue an interrupted GRPO run from its last checkpoint)\n\n"
        "  accelerate launch --num_processes 2 -m trace_cli train --method grpo ...   (data-parallel)\n\n"
        "Config keys are those of schemas/config/train.v1.json; --set KEY=VALUE overrides any of them."
    )
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config (kind: train).")
@click.option(
    "--method",
    type=click.Choice(["sft", "grpo"]),
    help="sft: supervised fine-tuning on demonstrations; grpo: LoRA adapter trained with GRPO.",
)
@click.option("--env", help="Environment reference (shop, 'shop?families=a,b', store://environment/NAME).")
@click.option("--model", help="Model to start from (store://model/NAME or an HF dir).")
@click.option(
    "--deficit", "deficits", multiple=True, help="[sft] Capability withheld from demonstrations (repeatable)."
)
@click.option("--seeds", help="Training seeds A:B (default 100000:103000).")
@click.option("--max-minutes", type=float, help="[sft] Stop training after this wall time.")
@click.option("--max-steps", type=int, help="[grpo] Optimizer steps (default 20).")
@click.option("--capability", help="[grpo] Capability the adapter is for (default: the environment's).")
@click.option("--resume", is_flag=True, help="[grpo] Continue an interrupted run from its last checkpoint.")
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable)."
)
@click.option("--name", help="Alias for the output artifact.")
@click.option("--force", is_flag=True, help="Re-train even if an identical artifact exists.")
@json_option
@store_option
def train(
    config_file,
    method,
    env,
    model,
    deficits,
    seeds,
    max_minutes,
    max_steps,
    capability,
    resume,
    overrides,
    name,
    force,
    as_json,
    store_dir,
):
    """Train a model. SFT writes a model artifact (full fine-tune, or LoRA merged with lora.enabled=true);
    GRPO writes an adapter artifact (a PEFT LoRA on the frozen base; evaluate with --model store://adapter/NAME)."""
    from trace_cli.config.loading import apply_overrides, load_document
    from trace_cli.stages.base import execute
    from trace_cli.training.dist import is_main_process

    main = is_main_process()  # under accelerate launch: only rank 0 names artifacts and prints
    cfg = load_document(config_file) or {} if config_file else {}
    if not isinstance(cfg, dict):
        from trace_cli.errors import InputError

        raise InputError(
            f"{config_file}: expected a mapping of train config keys (method: ..., env: ..., model: ...), "
            f"got {type(cfg).__name__}",
            hint="see schemas/config/train.v1.json for the keys",
        )
    cfg = dict(cfg)
    for k, v in (
        ("method", method),
        ("env", env),
        ("model", model),
        ("seeds", seeds),
        ("max_minutes", max_minutes),
        ("max_steps", max_steps),
        ("capability", capability),
    ):
        if v is not None:
            cfg[k] = v
    if deficits:
        cfg["deficits"] = list(deficits)
    if resume:
        cfg["resume"] = True
    cfg, applied = apply_overrides(cfg, list(overrides))
    for a in applied:
        if main:
            info(f"override {a['key']}: {a['old']!r} -> {a['new']!r}")
    missing = [req for req in ("method", "env", "model") if req not in cfg]
    if config_file or overrides:
        # the file's (or --set's) own mistakes first, every one with its key, not a secondary "--model is
        # required" when the file spells it `modle`
        from trace_cli.config.schemas import validate
        from trace_cli.errors import UsageError, ValidationError
        from trace_cli.stages import config_schema

        try:
            doc = {k: v for k, v in cfg.items() if v is not None or k == "seed"}
            validate(doc, config_schema("train"), source=config_file or "--set")
        except ValidationError as e:
            also = (
                f"\n(or give {', '.join(f'--{m}' for m in missing)} on the command line)" if missing else ""
            )
            raise UsageError(e.message + also) from e
    if missing:
        from trace_cli.errors import UsageError

        raise UsageError(f"--{missing[0]} is required (or set it in --config)")
    out = execute(
        "train", cfg, open_store(store_dir), name=name if main else None, overrides=applied, force=force
    )
    if not main:
        return
    a = out.main
    if as_json:
        echo_json({"id": a.id, "uri": a.uri, "kind": a.kind, "skipped": out.skipped, "summary": a.summary})
        return
    if out.skipped:
        info(f"up to date: {a.uri} (use --force to re-train)")
    s = a.summary
    if s.get("method") == "grpo":
        print_table(
            [
                "artifact",
                "capability",
                "steps",
                "rollouts",
                "reward first",
                "reward last",
                "success last",
                "train s",
            ],
            [
                [
                    a.uri,
                    s.get("capability"),
                    s.get("steps"),
                    s.get("rollouts"),
                    s.get("reward_first"),
                    s.get("reward_last"),
                    s.get("success_last"),
                    s.get("train_s"),
                ]
            ],
        )
        return
    print_table(
        ["artifact", "method", "demos", "steps", "final loss", "train s"],
        [
            [
                a.uri,
                s.get("method"),
                s.get("demonstrations"),
                s.get("steps"),
                s.get("final_loss"),
                s.get("train_s"),
            ]
        ],
    )
