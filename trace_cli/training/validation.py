"""Early stopping of a GRPO adapter on its own environment's validation seeds (`train` config key `validation`).

Before the first step and every `every` optimizer steps, the adapter being trained plays the environment's
validation seeds greedily (one episode per seed, the run's own turn and token limits); its mean reward is the
score. A score above the best by more than `min_delta` makes the adapter the best one, saved under
`output_dir/best`; after `patience` evaluations without one, training stops. The run's result is the best adapter,
not the last: the step-0 evaluation is the untrained LoRA (its B matrices are zero: the base itself), so an
adapter that never beats the base on its environment comes back as the base's behaviour.

The validation seeds must be disjoint from the training seeds (the stage checks). Their episodes are rollouts
that drive a choice: they are counted (`episodes`) and the benchmark charges them. The state (history, best) is
written to `output_dir/validation.json` after every evaluation, so a resumed run continues it.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BEST_DIR = "best"
STATE_FILE = "validation.json"


@dataclass
class ValidationState:
    history: list[dict[str, Any]] = field(default_factory=list)  # {step, reward, success, episodes}
    best_step: int | None = None
    best_reward: float | None = None
    since_best: int = 0  # evaluations since the best
    stopped_at: int | None = None  # the step training stopped at for want of improvement

    @property
    def episodes(self) -> int:
        return sum(h["episodes"] for h in self.history)

    def record(self, step: int, reward: float, success: float, episodes: int, min_delta: float) -> bool:
        """Add an evaluation; True when it is the new best."""
        self.history.append({"step": step, "reward": reward, "success": success, "episodes": episodes})
        if self.best_reward is None or reward > self.best_reward + min_delta:
            self.best_step, self.best_reward, self.since_best = step, reward, 0
            return True
        self.since_best += 1
        return False

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "episodes": self.episodes}


def validation_until(summary: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    """The validation summary of a run of `step` steps, from a longer run's (its evaluations up to `step`)."""
    if not summary:
        return summary
    kept = ValidationState()
    for h in summary["history"]:
        if h["step"] <= step:
            kept.record(h["step"], h["reward"], h["success"], h["episodes"], 0.0)
    kept.best_step, kept.best_reward = summary["best_step"], summary["best_reward"]
    if kept.best_step is not None and kept.best_step > step:  # not reached: the best of the kept ones
        top = max(kept.history, key=lambda h: h["reward"], default=None)
        kept.best_step, kept.best_reward = (top["step"], top["reward"]) if top else (None, None)
    stopped = summary["stopped_at"]
    kept.stopped_at = stopped if stopped is not None and stopped <= step else None
    return kept.summary()


def check_validation(validation: Mapping[str, Any] | None, seeds: list[int]) -> None:
    """The validation seeds must exist and be none of the training seeds (UsageError)."""
    from trace_cli.config.seeds import parse_seeds
    from trace_cli.errors import UsageError

    if not validation:
        return
    val = parse_seeds(validation["seeds"])
    if not val:
        raise UsageError(f"validation.seeds {validation['seeds']!r}: no seeds")
    both = set(val) & set(seeds)
    if both:
        raise UsageError(
            f"validation.seeds {validation['seeds']!r} overlap the training seeds ({len(both)} in common, "
            f"e.g. {min(both)}); choosing the adapter on seeds it trained on says nothing"
        )


def load_state(output_dir: str | Path) -> ValidationState:
    p = Path(output_dir) / STATE_FILE
    return ValidationState(**json.loads(p.read_text())) if p.is_file() else ValidationState()


def _save_state(output_dir: str | Path, state: ValidationState) -> None:
    p = Path(output_dir) / STATE_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=1) + "\n")
    tmp.replace(p)


def best_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / BEST_DIR


def _replace(staged: Path, target: Path) -> None:
    """`staged` (a directory beside `target`) becomes `target`, replacing it."""
    if target.exists():
        shutil.rmtree(target)
    staged.replace(target)


def save_adapter(model, target: Path) -> None:
    """The PEFT adapter files of `model` at `target`, replaced atomically."""
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    _replace(tmp, target)


def copy_best(output_dir: str | Path, target: Path) -> None:
    """The best adapter so far (PEFT files only) at `target`, replaced atomically."""
    from trace_cli.training.checkpoints import copy_adapter

    tmp = target.with_name(target.name + ".tmp")
    copy_adapter(best_dir(output_dir), tmp)
    _replace(tmp, target)


def evaluate(
    model, tok, spec, seeds: list[int], max_context: int | None, engine: Any = None
) -> tuple[float, float]:
    """(mean reward, success rate) of greedy episodes of `model` on `seeds` of the run's environment, generated
    on `engine` (the run's rollout engine; None: `model` in this process)."""
    import dataclasses

    import torch

    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.envs.rollout import rollout

    greedy = dataclasses.replace(spec.sampling, temperature=0.0, top_p=1.0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            policy = TokenPolicy.sampling_as(
                model, tok, greedy, top_k=0, max_context=max_context, seed=spec.seed, engine=engine
            )
            results = rollout(
                policy,
                spec.make_env,
                [(s, 0) for s in seeds],
                max_turns=spec.max_turns,
                batch_size=spec.rollout_batch_size,
            )
    finally:
        if was_training:
            model.train()
    n = max(1, len(results))
    return sum(r.reward for r in results) / n, sum(bool(r.success) for r in results) / n


def validation_callback(spec, tok, max_context: int | None, run_engine: Any = None, holder: Any = None):
    """The trainer callback that evaluates, keeps the best adapter and stops training (main process decides).
    With a `run_engine` (training.rollout_engine) validation runs on the run's rollout engine (`holder`: where
    the trainer is, once built)."""
    from transformers import TrainerCallback

    from trace_cli.config.seeds import parse_seeds
    from trace_cli.training.dist import world_size

    validation = spec.validation
    seeds = parse_seeds(validation["seeds"])
    every, patience, min_delta = validation["every"], validation["patience"], validation["min_delta"]
    out = spec.output_dir

    def check(step: int, model, log) -> bool:
        """Evaluate at `step`; True when training should stop."""
        state = load_state(out)
        if any(h["step"] == step for h in state.history):  # resumed: evaluated before the crash
            return state.stopped_at is not None
        engine = None
        if run_engine is not None:
            engine = run_engine.for_validation((holder or {}).get("trainer"), model, step)
        reward, success = evaluate(model, tok, spec, seeds, max_context, engine)
        if state.record(step, reward, success, len(seeds), min_delta):
            save_adapter(model, best_dir(out))
        stop = state.since_best >= patience
        if stop:
            state.stopped_at = step
        _save_state(out, state)
        if log is not None:  # the run prints progress (main process): one line per evaluation
            print(
                f"validation step {step:>4}  reward {reward:.3f}  success {success:.2f}  best {state.best_reward:.3f}"
                f" (step {state.best_step}){'  stopping: no better for ' + str(patience) if stop else ''}",
                file=sys.stderr,
                flush=True,
            )
        return stop

    class _Validation(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            if state.is_world_process_zero and model is not None:
                check(state.global_step, model, spec.log)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % every or model is None:
                return
            stop = check(state.global_step, model, spec.log) if state.is_world_process_zero else False
            if world_size() > 1:  # every rank stops at the same step: rank 0 decided
                from accelerate.utils import broadcast_object_list

                stop = broadcast_object_list([stop])[0]
            if stop:
                control.should_training_stop = True

    return _Validation()


__all__ = [
    "ValidationState",
    "best_dir",
    "check_validation",
    "copy_best",
    "evaluate",
    "load_state",
    "validation_callback",
    "validation_until",
]
