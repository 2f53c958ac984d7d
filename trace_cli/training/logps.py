"""Per-token log-probabilities of GRPO completions, computed the cheap way for groups that share a prompt
(`shared_prompt_logps`: each prompt run once, the LM head only on scored positions, in chunks), and the checks of
when a model allows it (`plain_head`, `checkpointing_active`). No TRL here: `grpo_trainer` plugs it into TRL."""

from __future__ import annotations

from typing import Any


def causal_lm(model):
    """The transformers causal LM inside a PEFT model (LoRA layers are injected in place, so its modules run
    the adapter)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def checkpointing_active(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules()) and model.training


def plain_head(model) -> bool:
    """An LM head that is one linear layer on the backbone's last hidden state (no logit scaling or soft-capping,
    which TRL's fused head handles and `shared_prompt_logps` does not)."""
    lm = causal_lm(model)
    cfg = lm.config.get_text_config()
    scaled = any(
        getattr(cfg, k, None) not in (None, 1.0)
        for k in (
            "final_logit_softcapping",
            "logit_scale",
            "output_multiplier",
            "lm_head_multiplier",
            "logits_scaling",
        )
    )
    head = lm.get_output_embeddings()
    return not scaled and head is not None and hasattr(head, "weight") and hasattr(lm, lm.base_model_prefix)


LOGP_CHUNK = 1024  # positions per LM-head chunk: [chunk, vocab] fp32 logits at a time (200 MB at 49k)


def _chunk_logps(hidden, weight, bias, labels, temperature: float):
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    return logits.gather(-1, labels[:, None]).squeeze(-1) - logits.logsumexp(-1)


def _chunk_entropy(hidden, weight, bias, temperature: float):
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    return torch.distributions.Categorical(logits=logits).entropy()


def chunked_logps(hidden, weight, bias, labels, temperature: float, entropy: bool = False):
    """Log-probabilities of `labels` [M] under the LM head applied to `hidden` [M, H], `LOGP_CHUNK` positions at a
    time; each chunk's logits are recomputed in the backward pass (activation checkpointing), so no more than
    one chunk of vocabulary-wide logits is ever held. Entropies (detached, for TRL's metrics) on request."""
    import torch
    from torch.utils.checkpoint import checkpoint

    out, ents = [], []
    for a in range(0, hidden.size(0), LOGP_CHUNK):
        h, y = hidden[a : a + LOGP_CHUNK], labels[a : a + LOGP_CHUNK]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            out.append(checkpoint(_chunk_logps, h, weight, bias, y, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logps(h, weight, bias, y, temperature))
        if entropy:
            with torch.no_grad():
                ents.append(_chunk_entropy(h, weight, bias, temperature))
    empty = hidden.new_zeros((0,), dtype=torch.float32)
    lp = torch.cat(out) if out else empty
    return lp, (torch.cat(ents) if ents else empty) if entropy else None


def shared_prompt_logps(
    model, input_ids, attention_mask, logits_to_keep: int, temperature: float, score_mask=None, entropy=False
):
    """Per-token log-probabilities (and entropies) of the completions in TRL's padded batch, as TRL's
    `_get_per_token_logps_and_entropies` returns them ([rows, logits_to_keep], 0 where nothing is scored), computed
    the cheap way for GRPO groups:

      * rows with the same prompt (a group: TRL's prompts are left-padded copies) run that prompt once, unpadded;
        the group's completions then run against its keys/values (shared, so the gradient reaching the prompt
        from every row is summed, as in a padded forward of each row);
      * each completion runs on its own, unpadded, up to its last scored token (causal: later tokens and the
        right padding cannot change an earlier position);
      * the LM head and log-softmax run only on the scored positions (`score_mask`: TRL's tool mask, 0 on
        environment tokens; else every real completion token), in chunks (`chunked_logps`), never on the prompt.

    On a CPU this runs a shop group's ~1,000-token prompt once instead of `num_generations` times and skips the
    vocabulary-wide head over ~2/3 of the positions; the numbers are those of a padded forward (float rounding
    aside: tested against a padded forward)."""
    import torch
    from transformers import DynamicCache

    lm = causal_lm(model)
    backbone = getattr(lm, lm.base_model_prefix)
    head = lm.get_output_embeddings()
    n, width = input_ids.shape
    p_len = width - logits_to_keep
    prompt_ids, comp_ids = input_ids[:, :p_len], input_ids[:, p_len:]
    p_mask, c_mask = attention_mask[:, :p_len].bool(), attention_mask[:, p_len:].bool()
    scored = c_mask if score_mask is None else c_mask & score_mask.bool()
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(n):
        groups.setdefault(tuple(prompt_ids[i][p_mask[i]].tolist()), []).append(i)
    dev = input_ids.device
    lp_rows: list[Any] = [torch.zeros(logits_to_keep, dtype=torch.float32, device=dev)] * n
    ent_rows: list[Any] = list(lp_rows)
    for prompt, rows in groups.items():
        # a row is run up to its last scored token: what follows cannot change an earlier position (causal)
        ends = {r: int(scored[r].nonzero().max()) + 1 for r in rows if bool(scored[r].any())}
        if not ends:
            continue
        out = backbone(
            input_ids=torch.tensor([prompt], device=dev), past_key_values=DynamicCache(), use_cache=True
        )
        h_last = out.last_hidden_state[0, -1:]  # predicts each row's first completion token
        kv = _kv(out)
        for r, end in ends.items():
            comp = comp_ids[r, :end]
            # each row on its own, unpadded, against the prompt's keys/values (shared: their gradients add up)
            h = backbone(
                input_ids=comp[None], past_key_values=DynamicCache(kv), use_cache=True
            ).last_hidden_state
            pred = torch.cat([h_last, h[0, :-1]])  # position t predicts token t
            sel = scored[r, :end]
            lp, en = chunked_logps(pred[sel], head.weight, head.bias, comp[sel], temperature, entropy)
            pad = (0, logits_to_keep - end)
            lp_rows[r] = torch.nn.functional.pad(lp.new_zeros(end).masked_scatter(sel, lp), pad)
            if entropy:
                ent_rows[r] = torch.nn.functional.pad(en.new_zeros(end).masked_scatter(sel, en), pad)
    logps = torch.stack(lp_rows)
    ents = torch.stack(ent_rows) if entropy else None
    if torch.is_grad_enabled() and not logps.requires_grad:
        # nothing scored (every group dropped): the loss must still reach the trainable parameters, as zero
        anchor = next((q for q in model.parameters() if q.requires_grad), None)
        if anchor is not None:
            logps = logps + 0.0 * anchor.reshape(-1)[0]
    return logps, ents


def _kv(out) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in out.past_key_values.layers]
