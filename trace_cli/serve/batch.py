"""The running batch's tensors: new rows' prefill inputs laid out after their cached prefixes, joining rows
to the batch, dropping rows from it, and reading one row's keys/values back out.

A row's cache is left-padded: `[pad.. cached prefix][pad.. new tokens]` with attention mask 0 on the pads,
positions from the mask's cumulative sum, so every real token has the position it has in one unpadded pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Prefill:
    """New rows being prefilled, chunk by chunk: `ids`/`pos` [rows, wn] the tokens not cached (left-padded),
    `mask` [rows, wc + wn] over cached and new, `cache` holds the first `wc + fed` columns."""

    group: list[Any]
    ids: Any
    pos: Any
    mask: Any
    cache: Any
    wc: int
    fed: int = 0

    @property
    def width(self) -> int:
        return self.ids.shape[1]


def prefill_inputs(
    prompts: list[list[int]], hits: list[tuple[int, Any]], pad: int, config, device
) -> Prefill:
    """The inputs that prefill `prompts` (a row's first `hits[i][0]` tokens come cached, with their per-layer
    keys/values [heads, n, head_dim])."""
    import torch
    from transformers import DynamicCache

    g = len(prompts)
    wc = max(n for n, _ in hits)
    wn = max(len(p) - n for p, (n, _) in zip(prompts, hits, strict=True))
    ids = torch.full((g, wn), pad, dtype=torch.long)
    mask = torch.zeros((g, wc + wn), dtype=torch.long)
    for i, (p, (n, _)) in enumerate(zip(prompts, hits, strict=True)):
        new = p[n:]
        ids[i, wn - len(new) :] = torch.tensor(new, dtype=torch.long)
        mask[i, wc + wn - len(new) :] = 1
        mask[i, wc - n : wc] = 1
    cache = DynamicCache(config=config)
    if wc:
        ref = next(layers for n, layers in hits if n)
        for li, (k0, v0) in enumerate(ref):
            k = k0.new_zeros((g, k0.shape[0], wc, k0.shape[-1]))
            v = v0.new_zeros((g, v0.shape[0], wc, v0.shape[-1]))
            for i, (n, layers) in enumerate(hits):
                if n:
                    k[i, :, wc - n :] = layers[li][0]
                    v[i, :, wc - n :] = layers[li][1]
            cache.update(k.to(device), v.to(device), li)
    mask = mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, wc:]
    return Prefill(list(), ids.to(device), pos, mask, cache, wc)


def join(cache, mask, new_cache, new_mask):
    """The running batch's cache and mask with new rows appended, both left-padded to the longer length."""
    import torch
    import torch.nn.functional as F

    a, b = mask.shape[1], new_mask.shape[1]
    width = max(a, b)
    mask = torch.cat([F.pad(mask, (width - a, 0)), F.pad(new_mask, (width - b, 0))], 0)
    for old, new in zip(cache.layers, new_cache.layers, strict=True):
        old.keys = torch.cat(
            [F.pad(old.keys, (0, 0, width - a, 0)), F.pad(new.keys, (0, 0, width - b, 0))], 0
        )
        old.values = torch.cat(
            [F.pad(old.values, (0, 0, width - a, 0)), F.pad(new.values, (0, 0, width - b, 0))], 0
        )
    return cache, mask


def select_rows(cache, mask, keep: list[int]):
    """Rows `keep` of a batch's cache and mask, all-pad columns on the left trimmed; (mask, row index)."""
    import torch

    idx = torch.tensor(keep, dtype=torch.long, device=mask.device)
    mask = mask.index_select(0, idx)
    real = mask.any(0).nonzero()
    start = int(real[0]) if len(real) else 0
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, idx.to(layer.keys.device))[:, :, start:]
        layer.values = layer.values.index_select(0, idx.to(layer.values.device))[:, :, start:]
    return mask[:, start:], idx


def row_kv(cache, mask, r: int, start: int = 0) -> list[tuple[Any, Any]]:
    """Row `r`'s keys/values per layer at its real positions from its `start`-th on: [heads, n, head_dim]."""
    real = mask[r].nonzero().squeeze(-1)[start:]
    return [
        (layer.keys[r].index_select(1, real.to(layer.keys.device)),
         layer.values[r].index_select(1, real.to(layer.values.device)))
        for layer in cache.layers
    ]  # fmt: skip
