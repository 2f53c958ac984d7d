"""`trace train`: SFT a base agent on demonstrations (with deficits), or a GRPO LoRA adapter on an environment."""

from __future__ import annotations

from trace_cli.cli.common import echo_json, echo_outcome, info, open_store, print_table
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
    "--profile",
)


@TRAIN.command(
    epilog=(
        "Examples:\n\n  trace train --method sft --env shop --model store://model/small "
        "--deficit precondition_verification --deficit multi_step_completion --name base\n\n"
        "  trace train --method grpo --env store://environment/precondition --model store://model/base "
        "--name precondition --set max_steps=20\n\n"
        "  trace train --method grpo --env shop --model store://model/base --name grpo-target   "
        "(the 'GRPO on target' baseline)\n\n"
        "  trace train --method grpo --env shop --model store://model/base --max-steps 24 "
        "--set 'snapshot_steps=[8,16]'   (also the adapters after 8 and 16 steps: a learning curve in one run)\n\n"
        "  trace train --config train.yaml --resume   (continue an interrupted GRPO run from its last checkpoint)\n\n"
        "  accelerate launch --num_processes 2 -m trace_cli train --method grpo ...   (data-parallel)\n\n"
        "  trace train --method grpo --env store://environment/E --model /models/Qwen3-4B --profile auto "
        "--set rollout.engine=vllm   (one 80 GB GPU: batch sizes and vLLM memory for the model's size)\n\n"
        "Config keys are those of schemas/config/train.v1.json; --set KEY=VALUE overrides any of them."
    ),
    outputs=("Alias for the output artifact.", "Re-train even if an identical artifact exists."),
    run=False,
)
def train(name, force, as_json, store_dir, **flags):
    """Train a model. SFT writes a model artifact (full fine-tune, or LoRA merged with lora.enabled=true);
    GRPO writes an adapter artifact (a PEFT LoRA on the frozen base; evaluate with --model store://adapter/NAME);
    GRPO on a list of environments (env in --config or --set) one adapter per environment, NAME-CAPABILITY."""
    from trace_cli.stages.base import execute_each, failed
    from trace_cli.training.dist import is_main_process

    main = is_main_process()  # under accelerate launch: only rank 0 names artifacts and prints
    cfg, applied = TRAIN.config(flags, announce=main)
    members = []
    for m in execute_each(
        "train", cfg, open_store(store_dir), name=name if main else None, overrides=applied, force=force
    ):
        members.append(m)
        if main and m.failure is not None and not as_json:
            info(f"error: {m.key}: {m.failure.message}")
    if main and members[0].key is None:
        _report(members[0].outcome, as_json)
    elif main:
        _report_each(members, as_json)
    err = failed("train", members)
    if err is not None:
        raise err


def _report(out, as_json: bool) -> None:
    if echo_outcome(out, as_json, "use --force to re-train"):
        return
    a, s = out.main, out.main.summary
    if s.get("method") == "grpo":
        print_table(GRPO_COLUMNS, [_grpo_row(a)])
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


def _report_each(members, as_json: bool) -> None:
    """One adapter per environment: a row (or JSON entry) each, and the failures."""
    done = [m for m in members if m.outcome is not None]
    if as_json:
        adapters = [
            {
                "capability": m.key,
                "name": m.name,
                "id": m.outcome.main.id,
                "uri": m.outcome.main.uri,
                "skipped": m.outcome.skipped,
                "summary": m.outcome.main.summary,
            }
            for m in done
        ]
        failures = [{"capability": m.key, "error": m.failure.message} for m in members if m.failure]
        echo_json({"adapters": adapters, "failures": failures})
        return
    for m in done:
        if m.outcome.skipped:
            info(f"up to date: {m.outcome.main.uri} (use --force to re-train)")
    print_table(GRPO_COLUMNS, [_grpo_row(m.outcome.main) for m in done])


GRPO_COLUMNS = [
    "artifact",
    "capability",
    "steps",
    "rollouts",
    "reward first",
    "reward last",
    "success last",
    "train s",
]


def _grpo_row(a) -> list:
    s = a.summary
    keys = ("capability", "steps", "rollouts", "reward_first", "reward_last", "success_last", "train_s")
    return [a.uri, *(s.get(k) for k in keys)]
