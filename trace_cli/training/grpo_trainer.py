"""`TraceGRPOTrainer`: TRL's GRPOTrainer with constant-reward groups dropped from the loss, micro-batches of whole
groups, and log-probabilities by `trace_cli.training.logps.shared_prompt_logps`. Built by a function so that trl is
imported only when a run starts."""

from __future__ import annotations

from typing import Any

from trace_cli.training.logps import checkpointing_active, plain_head, shared_prompt_logps


def trainer_class():
    """GRPOTrainer + dropping constant-reward groups from the loss (ARCHITECTURE.md, "The method": "groups with
    constant reward dropped"). TRL gives such groups zero advantage; we also take their tokens out of the loss
    normaliser so they do not dilute the groups that carry signal."""
    import torch
    from trl import GRPOTrainer

    class TraceGRPOTrainer(GRPOTrainer):
        drop_constant_groups = True
        # log-probabilities per prompt group (`shared_prompt_logps`); False = TRL's padded forward of every row
        shared_prompt = True
        _last_rewards: list[float] | None = None
        # the loss mask of the micro-batch being scored (the positions worth a log-probability)
        _score_mask = None

        def _prepare_inputs(self, generation_batch):
            """TRL's, except that the generation batch is shuffled by whole groups (rows with the same prompt stay
            together), so a micro-batch holds whole groups and their prompt is run once (`shared_prompt_logps`).
            The step's gradient is the same: the loss is a sum over the step's rows normalised per step (dapo,
            dr_grpo) or per sequence (grpo), and only bnpo's per-micro-batch normaliser sees the order."""
            if not (self.shared_prompt and self.model.training and _plain_batch(generation_batch)):
                return super()._prepare_inputs(generation_batch)
            from trl.trainer.utils import split_tensor_dict

            every = self.args.steps_per_generation * self.num_iterations
            if self._step % every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                batch = shuffle_groups(batch)
                self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

        def compute_loss(self, model, inputs, *args, **kwargs):
            self._score_mask = inputs.get("tool_mask")
            try:
                return super().compute_loss(model, inputs, *args, **kwargs)
            finally:
                self._score_mask = None

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
            unwrapped = self.accelerator.unwrap_model(model)
            if not (
                self.shared_prompt
                and not compute_aux_loss
                and all(v is None for v in media.values())
                and self.accelerator.num_processes == 1  # DDP's gradient hooks live in the wrapper's forward
                and not checkpointing_active(unwrapped)
                and plain_head(unwrapped)
            ):
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
                    unwrapped,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    self.temperature,
                    score,
                    compute_entropy,
                )
            return logps, ent, None

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if not self.drop_constant_groups or self._last_rewards is None or not self.model.training:
                return out
            device = out["advantages"].device
            local = torch.tensor(self._last_rewards, dtype=torch.float32, device=device)
            self._last_rewards = None
            rewards = self.accelerator.gather(local).view(-1, self.num_generations)
            const = (rewards.max(dim=1).values == rewards.min(dim=1).values).repeat_interleave(
                self.num_generations
            )
            n = len(local)
            mine = const[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n]
            keep = (~mine).long().unsqueeze(1)
            mask = out.get("tool_mask")
            if mask is None:
                mask = torch.ones_like(out["completion_mask"])
            out["tool_mask"] = mask * keep
            items = self.accelerator.gather((out["completion_mask"] * out["tool_mask"]).sum()).sum()
            out["num_items_in_batch"] = items.clamp(min=1)
            return out

    return TraceGRPOTrainer


def _plain_batch(batch) -> bool:
    """A text-only generation batch (no images or other media TRL splits by grid)."""
    return not any(k in batch[0] for k in ("images", "image", "pixel_values")) if batch else True


def shuffle_groups(batch: dict[str, Any]) -> dict[str, Any]:
    """TRL's `shuffle_sequence_dict`, by groups: the rows that share a prompt stay together (in order), the groups
    come in random order."""
    import torch

    ids, mask = batch["prompt_ids"], batch["prompt_mask"]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(ids.size(0)):
        groups.setdefault(tuple(ids[i][mask[i].bool()].tolist()), []).append(i)
    order = list(groups.values())
    perm = torch.tensor([i for g in torch.randperm(len(order)).tolist() for i in order[g]], dtype=torch.long)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[perm.to(v.device)]
        return [v[i] for i in perm.tolist()]

    return {k: permute(v) for k, v in batch.items()}
