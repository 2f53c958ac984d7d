"""One GRPO run, assembled in one place: `run_grpo(GRPORun)` is the entry point `trace train --method grpo` calls.

The stage resolves everything that needs the store or the command line (the model, the environment, the seeds,
the calibration episodes to replay, the run's id) into a `GRPORun`, typed settings; this module does the rest:
joins the process group, claims the resumable work dir, builds the trainer's `GRPOSpec`, trains
(`training.grpo.train_grpo`), turns the Trainer's log into metrics rows, refuses a run that learned nothing, and
hands back a `GRPOOutcome` that writes an adapter artifact's files (the final adapter or a snapshot's) into a
directory the stage gives it. The work dir lives until the `with` block ends, so the stage stores the artifact
first; a run that dies keeps it for `--resume`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.errors import CheckFailed

ADAPTER_DIR = "adapter"
RESOLVED_CONFIG_FILE = "train_config.json"
# spec fields that are the run's plumbing, not its settings (left out of train_config.json)
NOT_RESOLVED = ("make_env", "log", "output_dir", "resume_from", "snapshot_steps", "replay")


@dataclass(frozen=True)
class GRPORun:
    """What the stage resolved for one GRPO run."""

    config: Mapping[str, Any]  # the validated grpo `train` config (schema defaults filled)
    run_id: str  # the adapter artifact's id: names the work dir
    model_path: Path  # the base model's HF directory
    make_env: Callable[[], Any]
    seeds: Sequence[int]
    work_root: Path  # the work dir goes under it (STORE/.tmp)
    episodes_per_step: (
        int  # all processes together (training.grpo_spec.episodes_per_step, checked by the preflight)
    )
    logging_dir: str  # tensorboard event files
    resume: bool  # continue from the work dir's latest checkpoint
    replay: Sequence[Mapping[str, Any]] = ()  # calibration episodes served as the first steps' rollouts
    log: Callable[[dict[str, Any]], None] | None = None  # one call per optimizer step (rank 0)
    marker: Mapping[str, Any] = field(default_factory=dict)  # what `trace store gc` reads in the work dir


@dataclass
class GRPOOutcome:
    """A finished run, as one rank sees it, up to `step` (the last one, or a snapshot's)."""

    spec: Any  # training.grpo_spec.GRPOSpec
    result: Any  # training.grpo_spec.GRPOResult
    rows: list[dict[str, Any]]  # one metrics row per optimizer step (store.tables.GRPO_METRICS)
    main: bool  # rank 0: the one that writes
    world: int
    adapter_dir: Path

    @property
    def steps(self) -> int:
        return self.result.global_step

    def at(self, step: int) -> GRPOOutcome | None:
        """The run as a run of `step` steps would have ended: its snapshot adapter, its first metric rows, its
        share of the time and of the replayed steps; None when training stopped before the snapshot was saved."""
        from trace_cli.training.grpo import snapshot_dir
        from trace_cli.training.validation import validation_until

        d = snapshot_dir(self.spec.output_dir, step)
        if not d.is_dir():
            return None
        r = self.result
        frac = step / max(1, r.global_step)
        per_replayed = r.replayed_episodes // max(1, r.replayed_steps)
        res = dataclasses.replace(
            r,
            global_step=min(step, r.global_step),
            validation=validation_until(r.validation, step),
            train_runtime_s=r.train_runtime_s * frac,
            train_cpu_s=r.train_cpu_s * frac,
            replayed_steps=min(r.replayed_steps, step),
            replayed_episodes=min(r.replayed_steps, step) * per_replayed,
        )
        rows = [row for row in self.rows if row["step"] <= step]
        return dataclasses.replace(self, result=res, rows=rows, adapter_dir=d)

    def write(self, path: Path, extra: Mapping[str, Any]) -> int:
        """An adapter artifact's files under `path`: the PEFT adapter with the base's tokenizer, the episodes kept,
        the per-step metrics, and the resolved settings (`extra` adds the stage's: max_steps as its config says,
        env, capability). Returns
        how many training episodes were kept."""
        from trace_cli.store.tables import GRPO_METRICS
        from trace_cli.training import checks
        from trace_cli.training.checkpoints import copy_adapter
        from trace_cli.training.episode_log import EPISODES_DIR, collect

        spec = self.spec
        copy_adapter(self.adapter_dir, path / ADAPTER_DIR)
        kept = collect(os.path.join(spec.output_dir, EPISODES_DIR), path, max_step=self.steps)
        checks.save_tokenizer(Path(spec.model_path), path / ADAPTER_DIR)
        GRPO_METRICS.write(self.rows, path)
        resolved = {k: v for k, v in vars(spec).items() if k not in NOT_RESOLVED}
        resolved.update(
            world_size=self.world,
            seeds_per_step=spec.episodes_per_step // spec.num_generations,
            **extra,
        )
        (path / RESOLVED_CONFIG_FILE).write_text(
            json.dumps(resolved, indent=2, sort_keys=True, default=str) + "\n"
        )
        return kept

    def summary(self) -> dict[str, Any]:
        """The training numbers of the adapter's summary."""
        from trace_cli.training.metrics import learning_summary

        r = self.result
        return {
            "steps": r.global_step,
            "num_generations": self.spec.num_generations,
            "world_size": self.world,
            **learning_summary(self.rows),
            "train_s": round(r.train_runtime_s, 3),
            "train_cpu_s": round(r.train_cpu_s, 3),
            "resumed_from_step": r.resumed_from_step,
            "trainable_parameters": r.trainable_parameters,
            "parameters": r.total_parameters,
            "lora_r": self.spec.lora["r"],
            "lora_alpha": self.spec.lora["alpha"],
            # rollouts this run did not generate: its first steps took the environment's calibration episodes
            "reused_calibration_steps": r.replayed_steps,
            "reused_calibration_episodes": r.replayed_episodes,
            "validation": r.validation,  # early stopping: evaluations, best step, episodes to charge
            "rollout": r.rollout,  # the engine, and with a server the adapter version loaded per step
        }


@contextlib.contextmanager
def run_grpo(run: GRPORun) -> Iterator[GRPOOutcome]:
    """Train one GRPO adapter (or resume it) and yield the outcome; the work dir is removed when the block ends
    without an error. Under `accelerate launch` every rank trains and yields; only rank 0 (`outcome.main`)
    should write. Raises CheckFailed (nothing kept) when `require_learning` and the run learned nothing."""
    from trace_cli.training import checks
    from trace_cli.training.checkpoints import WorkDir
    from trace_cli.training.dist import process_group
    from trace_cli.training.grpo import train_grpo
    from trace_cli.training.grpo_spec import GRPOSpec
    from trace_cli.training.metrics import metrics_rows, rollouts_after

    group = process_group()
    main, world = group.is_main_process, group.num_processes
    work = WorkDir(run.work_root, run.run_id, main=main)
    resume_from = work.claim(
        resume=run.resume,
        marker={**run.marker, "id": run.run_id, "pid": os.getpid(), "world_size": world},
        barrier=group.wait_for_everyone,
    )
    spec = GRPOSpec.from_config(
        run.config,
        model_path=str(run.model_path),
        make_env=run.make_env,
        seeds=list(run.seeds),
        output_dir=str(work.checkpoints),
        logging_dir=run.logging_dir,
        resume_from=str(resume_from) if resume_from else None,
        log=run.log if main else None,
        replay=run.replay,
        episodes_per_step=run.episodes_per_step,
    )
    result = train_grpo(spec)
    rows = metrics_rows(result.log_history, lambda s: rollouts_after(spec, s))
    if main and run.config["require_learning"]:
        failed = checks.nothing_learned(rows, result.last_dir or result.adapter_dir)
        if failed:
            work.remove()
            raise CheckFailed(f"grpo: {failed}; no adapter stored")
    yield GRPOOutcome(spec, result, rows, main, world, result.adapter_dir)
    group.wait_for_everyone()
    work.remove()
