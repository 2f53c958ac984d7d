"""`trace train`: SFT a base agent on demonstrations (with deficits), or a GRPO LoRA adapter on an environment."""

from __future__ import annotations

from trace_cli.cli.common import echo_outcome, print_table
from trace_cli.cli.options import Flag, StageOptions

TRAIN = StageOptions(
    "train",
    "--method",
    "--env",
    "--model",
    Flag("--deficit", "deficits"),
    "--seeds",
    "--max-minutes",
    "--max-steps",
    "--capability",
    "--resume",
)


@TRAIN.command(
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
    ),
    outputs=("Alias for the output artifact.", "Re-train even if an identical artifact exists."),
    run=False,
)
def train(name, force, as_json, store_dir, **flags):
    """Train a model. SFT writes a model artifact (full fine-tune, or LoRA merged with lora.enabled=true);
    GRPO writes an adapter artifact (a PEFT LoRA on the frozen base; evaluate with --model store://adapter/NAME)."""
    from trace_cli.training.dist import is_main_process

    main = is_main_process()  # under accelerate launch: only rank 0 names artifacts and prints
    out = TRAIN.execute(flags, name=name if main else None, force=force, store_dir=store_dir, announce=main)
    if not main or echo_outcome(out, as_json, "use --force to re-train"):
        return
    a, s = out.main, out.main.summary
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
