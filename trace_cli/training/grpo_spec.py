"""The settings and result of one GRPO run. `GRPOSpec` holds the grpo keys of the validated `train` config
(`GRPOSpec.from_config`); its fields have no defaults of their own, since schemas/config/train.v1.json states them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_cli.config.sampling import SamplingSettings
from trace_cli.training import from_config


def episodes_per_step(config: Mapping[str, Any], world: int) -> int:
    """Completions per optimizer step, all processes together: TRL's per_device_train_batch_size counts
    completions, and one generation batch of `gradient_accumulation_steps` micro-batches makes one step. The one
    place this is computed (the preflight checks it; the run and its metrics read it from the spec)."""
    return int(config["per_device_batch_size"]) * int(world) * int(config["gradient_accumulation_steps"])


@dataclass
class GRPOSpec:
    """Everything one GRPO run needs: the objects the stage resolved (no store or click objects), and the
    settings, named as the config keys they come from."""

    model_path: str
    make_env: Callable[[], Any]
    seeds: list[int]
    output_dir: str  # checkpoints go here (checkpoint-N/)
    num_generations: int
    per_device_batch_size: int
    gradient_accumulation_steps: int
    max_steps: int
    learning_rate: float
    lr_scheduler: str
    warmup_steps: int
    temperature: float
    top_p: float
    top_k: int
    beta: float
    epsilon: float
    epsilon_high: float | None
    loss_type: str
    scale_rewards: str
    num_iterations: int
    max_grad_norm: float
    drop_constant_groups: bool
    max_turns: int
    max_new_tokens: int
    max_completion_length: int
    rollout_batch_size: int
    lora: Mapping[str, Any]  # r, alpha, dropout, target_modules
    checkpoint_every: int
    precision: str
    gradient_checkpointing: bool | None
    use_vllm: bool
    vllm: Mapping[str, Any]
    rollout: Mapping[str, Any]  # the rollout engine (agents.engines.RolloutSettings): hf | vllm | server
    seed: int
    report_to: str  # none | tensorboard | trackio: TRL's live metrics integrations
    logging_dir: str | None  # tensorboard event files (the stage resolves null to STORE/logs/train/ID)
    episodes_kept: int  # at most this many training episodes kept under output_dir/episodes (`episode_log`)
    snapshot_steps: Sequence[int]  # also save the adapter after these steps: output_dir/snapshots/step-N
    episodes_per_step: int  # completions per optimizer step, all processes together (`episodes_per_step`)
    # early stopping (training.validation): seeds, every, patience, min_delta
    validation: Mapping[str, Any] | None
    resume_from: str | None = None
    # pre-generated on-policy episodes (calibration's, by the same base and sampler), served instead of new
    # rollouts while whole groups are left: dicts with prompt_ids, completion_ids, env_mask, reward, success,
    # n_actions, termination; consecutive runs of num_generations share a seed (one group)
    replay: Sequence[Mapping[str, Any]] = ()
    log: Callable[[dict[str, Any]], None] | None = None
    keep_model: bool = False  # return the trained PeftModel (tests inspect its parameters)

    @property
    def sampling(self) -> SamplingSettings:
        """How its rollouts sample (the same settings calibration records for `reuse_calibration`)."""
        return SamplingSettings.of(vars(self))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **run: Any) -> GRPOSpec:
        """The spec of a validated grpo `train` config (its defaults filled from the schema) and the run's own
        objects: model_path, make_env, seeds (parsed), output_dir, episodes_per_step, and optionally resume_from,
        log, keep_model."""
        return from_config(cls, config, **run)


@dataclass
class GRPOResult:
    adapter_dir: Path  # PEFT adapter files (rank 0 only; other ranks get the same path, possibly empty)
    log_history: list[dict[str, Any]]
    global_step: int
    train_runtime_s: float
    trainable_parameters: int
    total_parameters: int
    resumed_from_step: int | None
    model: Any = None
    train_cpu_s: float = 0.0  # process CPU time of trainer.train() (robust to other load on the machine)
    replayed_steps: int = 0  # rollout calls served from spec.replay (no new episodes generated)
    replayed_episodes: int = 0
    validation: dict[str, Any] | None = None  # training.validation.ValidationState.summary() when it ran
    # with early stopping: the adapter of the last step (adapter_dir is the best one)
    last_dir: Path | None = None
    # the engine the rollouts ran on; with a server, the adapter version loaded for each step's rollouts
    rollout: dict[str, Any] | None = None
