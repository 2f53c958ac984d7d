"""`TraceGRPOTrainer`: TRL's GRPOTrainer with log-probabilities computed per prompt group
(`trace_cli.training.logps.shared_prompt_logps`). Imports trl: `training.grpo` imports this module only when a run
starts.

What the run changes in TRL, and through which hook:
  * constant-reward groups out of the loss: `rollout_func` (a public GRPOTrainer argument) zeroes those episodes'
    `env_mask` (`grpo_rollout.mask_constant_groups`); TRL multiplies it into the loss mask and its normaliser;
  * the scored positions of a micro-batch: `compute_loss` (public: `transformers.Trainer`) reads the batch's tool
    mask, so the log-probabilities below skip environment tokens;
  * log-probabilities per prompt group: `_get_per_token_logps_and_entropies`, TRL's one method that computes
    them. TRL has no public hook there. It is overridden only while TRL's signature is the one this override was
    written against (`LOGPS_SIGNATURE`, trl 1.16); with another TRL the trainer keeps TRL's own computation (the
    same numbers, slower on a CPU) and says so once, so that a TRL upgrade changes speed, never what is trained.
"""

from __future__ import annotations

import inspect
import sys

from trl import GRPOTrainer

from trace_cli.training.logps import checkpointing_active, plain_head, shared_prompt_logps

# TRL's parameters of `_get_per_token_logps_and_entropies` the override takes (trl 1.16); any after them are
# media inputs (pixel_values, ...) defaulting to None, passed through by name
LOGPS_SIGNATURE = (
    "self",
    "model",
    "input_ids",
    "attention_mask",
    "logits_to_keep",
    "batch_size",
    "compute_entropy",
    "compute_aux_loss",
)


def logps_override_fits(method=GRPOTrainer._get_per_token_logps_and_entropies) -> bool:
    """Whether TRL's log-probability method takes the parameters the override was written against: those names
    in that order, then only optional media (default None) or **kwargs."""
    params = list(inspect.signature(method).parameters.values())
    head = tuple(p.name for p in params[: len(LOGPS_SIGNATURE)])
    rest = params[len(LOGPS_SIGNATURE) :]
    return head == LOGPS_SIGNATURE and all(p.kind == p.VAR_KEYWORD or p.default is None for p in rest)


class TraceGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose log-probabilities run each prompt group's prompt once (`shared_prompt_logps`)."""

    # False: TRL's padded forward of every row (also what a TRL with another signature gets)
    shared_prompt = True
    # the loss mask of the micro-batch being scored (the positions worth a log-probability)
    _score_mask = None

    def compute_loss(self, model, inputs, *args, **kwargs):
        self._score_mask = inputs.get("tool_mask")
        try:
            return super().compute_loss(model, inputs, *args, **kwargs)
        finally:
            self._score_mask = None

    def _shared_prompt_applies(self, model, compute_aux_loss: bool, media) -> bool:
        unwrapped = self.accelerator.unwrap_model(model)
        return (
            self.shared_prompt
            and not compute_aux_loss
            and all(v is None for v in media.values())
            and self.accelerator.num_processes == 1  # DDP's gradient hooks live in the wrapper's forward
            and not checkpointing_active(unwrapped)
            and plain_head(unwrapped)
        )

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **media,
    ):
        if not self._shared_prompt_applies(model, compute_aux_loss, media):
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **media,
            )
        score = self._score_mask
        if score is not None and tuple(score.shape) != (input_ids.size(0), logits_to_keep):
            score = None
        with self.accelerator.autocast():  # as TRL's own forward (precision bf16: CPU/GPU autocast)
            logps, ent = shared_prompt_logps(
                self.accelerator.unwrap_model(model),
                input_ids,
                attention_mask,
                logits_to_keep,
                self.temperature,
                score,
                compute_entropy,
            )
        return logps, ent, None


if not logps_override_fits():
    del TraceGRPOTrainer._get_per_token_logps_and_entropies
    TraceGRPOTrainer.shared_prompt = False
    print(
        "train: this TRL's _get_per_token_logps_and_entropies takes other parameters than trl 1.16's; GRPO keeps "
        "TRL's own log-probabilities (the same numbers, slower on a CPU)",
        file=sys.stderr,
    )
