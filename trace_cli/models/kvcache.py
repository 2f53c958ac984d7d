"""Multi-turn generation that reuses each episode's KV cache across turns: a turn feeds only its new tokens.

An episode's context grows by a completion and the environment's reply each turn; re-prefilling the whole
conversation every turn made eval ~40x slower than batched generation on a real model. Each episode keeps
the keys/values of the tokens it has already run through the model (`EpisodeKV`); the next turn reuses the
longest common prefix of those tokens and its new context (normally all of them: our templates are
prefix-preserving, and TokenPolicy extends its token history by construction) and feeds the rest.

A batch mixes episodes with different cached lengths, so each row is laid out as
`[pad.. cached tokens][pad.. new tokens]` with attention mask 0 on the pads: the cached keys already carry
their rotary positions, and `generate` derives the new tokens' positions from the mask's cumulative sum, so
every real token sees the positions it would have had in one unpadded pass. After generation only the real
slots are kept per episode (pads are dropped), so no padding accumulates across turns. A row whose new
tokens would make the whole batch that wide (an episode starting beside running ones) is prefilled alone
first, when that computes fewer positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EpisodeKV:
    tokens: list[int]  # the tokens whose keys/values are cached, in order
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each [heads, len(tokens), head_dim]


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cache_layers(cache) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


_LAYER_CLASS: list[type] = []


def _growing_layer_class() -> type:
    """A transformers cache layer that writes new keys/values into a preallocated buffer.

    transformers' `DynamicLayer` appends with `torch.cat`, copying the layer's whole cache on every decoding step;
    on a CPU that copy was ~2/3 of a SmolLM2 decoding step at a 1,000-token context (batch 4, one thread). This
    layer allocates `capacity` positions once (growing geometrically if a call needs more) and exposes `keys` and
    `values` as views of the filled part, so a step writes only its own positions."""
    if _LAYER_CLASS:
        return _LAYER_CLASS[0]
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        capacity = 0

        def lazy_initialization(self, key_states, value_states) -> None:
            super().lazy_initialization(key_states, value_states)
            self._kb = self._vb = None
            self._n = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            need = self._n + key_states.shape[-2]
            if self._kb is None or need > self._kb.shape[-2]:
                old = self._kb.shape[-2] if self._kb is not None else 0
                cap = max(need, self.capacity, 2 * old)
                kb = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
                vb = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
                if self._n:
                    kb[..., : self._n, :] = self._kb[..., : self._n, :]
                    vb[..., : self._n, :] = self._vb[..., : self._n, :]
                self._kb, self._vb = kb, vb
            self._kb[..., self._n : need, :] = key_states
            self._vb[..., self._n : need, :] = value_states
            self._n = need
            self.keys, self.values = self._kb[..., :need, :], self._vb[..., :need, :]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._n if self.is_initialized else 0

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a preallocated generation cache is not cropped")

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("a preallocated generation cache is not repeated")

        def batch_select_indices(self, indices) -> None:
            raise NotImplementedError("a preallocated generation cache is not reindexed")

    _LAYER_CLASS.append(GrowingLayer)
    return GrowingLayer


def growing_cache(capacity: int, layers: list[tuple[Any, Any]] | None = None):
    """A `DynamicCache` of preallocated layers (`_growing_layer_class`) with room for `capacity` positions,
    optionally filled with per-layer (keys, values) of shape [batch, heads, len, head_dim]."""
    from transformers import DynamicCache

    cls = _growing_layer_class()

    def make() -> Any:
        layer = cls()
        layer.capacity = capacity
        return layer

    cache = DynamicCache()
    cache.layer_class_to_replicate = make
    for k, v in layers or []:
        layer = make()
        layer.update(k, v)
        cache.layers.append(layer)
    return cache


def _prefill(model, tokens: list[int], device, n: int = 0, past: list[tuple[Any, Any]] | None = None):
    """Per-layer (keys, values) [heads, len, head_dim] of `tokens`, one unpadded pass over all but the first
    `n`, whose keys/values `past` holds (same layout)."""
    import torch

    layers = [(k.unsqueeze(0), v.unsqueeze(0)) for k, v in past or []]
    with torch.no_grad():
        res = model(
            input_ids=torch.tensor([tokens[n:]], dtype=torch.long, device=device),
            past_key_values=growing_cache(len(tokens), layers),
            use_cache=True,
            logits_to_keep=1,
        )
    return [(k[0], v[0]) for k, v in _cache_layers(res.past_key_values)]


SOLO_COST = 32  # positions a row's own prefill pass is counted as costing beyond its tokens (call overhead)


def _solo_rows(new: list[int]) -> list[int]:
    """The rows to prefill alone, so that the positions computed (a padded batch computes every row as wide
    as its widest) are fewest: the k widest, k chosen by cost, none when no k saves anything."""
    b = len(new)
    order = sorted(range(b), key=lambda i: -new[i])
    best_k, best, alone = 0, b * new[order[0]], 0
    for k in range(1, b + 1):
        alone += new[order[k - 1]] - 1 + SOLO_COST
        cost = alone + b * (new[order[k]] if k < b else 1)
        if cost < best:
            best_k, best = k, cost
    return order[:best_k]


def _prefill_wide_rows(model, ctxs, caches: list, reuse: list[int], device) -> None:
    """Rows whose new tokens would widen the padded batch for every row get them (all but the last) prefilled
    alone, unpadded, first (`caches` and `reuse` updated): an episode that starts beside running ones (eval
    refills a finished slot) made every row of the batch prefill as many positions as its whole prompt."""
    for i in _solo_rows([len(c) - r for c, r in zip(ctxs, reuse, strict=True)]):
        c, r, kv = ctxs[i], reuse[i], caches[i]
        past = [(k[:, :r], v[:, :r]) for k, v in kv.layers] if r else None
        caches[i] = EpisodeKV(c[:-1], _prefill(model, c[:-1], device, r, past))
        reuse[i] = len(c) - 1


def _prefill_shared(
    model, ctxs: list[list[int]], caches: list[EpisodeKV | None], device
) -> list[EpisodeKV | None]:
    """Rows with nothing cached that have the same context get it (all but its last token) prefilled once,
    unpadded, and share that EpisodeKV: a GRPO group's episodes start from the same prompt, so its prefill (the
    system prompt and tool schemas, ~1,000 tokens in the shop) runs once per group instead of once per row."""

    fresh: dict[tuple[int, ...], list[int]] = {}
    for i, (c, kv) in enumerate(zip(ctxs, caches, strict=True)):
        if len(c) > 1 and _fresh(c, kv):
            fresh.setdefault(tuple(c), []).append(i)
    shared = {key: rows for key, rows in fresh.items() if len(rows) > 1}
    if not shared:
        return caches
    out = list(caches)
    for key, rows in shared.items():
        head = list(key[:-1])
        kv = EpisodeKV(head, _prefill(model, head, device))
        for i in rows:
            out[i] = kv
    return out


def generate_reusing(
    model,
    ctxs: list[list[int]],
    caches: list[EpisodeKV | None],
    pad_id: int,
    eos: list[int],
    *,
    prefix: Any = None,
    **gen_kwargs: Any,
) -> tuple[list[list[int]], list[EpisodeKV]]:
    """One batched `generate` over token contexts, reusing each row's cached prefix.

    Returns the completion per row (cut after its first stop token) and each row's new EpisodeKV (covering
    its context and completion, except the last generated token, which was never fed back). With `prefix`
    (a models.prefix_cache.PrefixCache for these weights), a row with nothing of its own cached starts
    from the longest prefix of its context that earlier episodes left there (the system prompt and tool
    schemas every episode shares) or that it shares with another such row (prefilled once, before the
    batch), and every row's context and completion go into it."""
    import torch

    device = next(model.parameters()).device
    if prefix is not None:
        _prefill_common(model, prefix, ctxs, caches, device)
        caches = [_from_prefix(prefix, c, kv) for c, kv in zip(ctxs, caches, strict=True)]
    caches = _prefill_shared(model, ctxs, list(caches), device)  # a copy: rows are replaced below
    reuse = []
    for c, kv in zip(ctxs, caches, strict=True):
        r = _lcp(kv.tokens, c) if kv is not None else 0
        reuse.append(min(r, len(c) - 1))  # at least one token must be fed to get the next logits
    _prefill_wide_rows(model, ctxs, caches, reuse, device)
    wc = max(reuse)
    wn = max(len(c) - r for c, r in zip(ctxs, reuse, strict=True))
    b = len(ctxs)
    ids = torch.full((b, wc + wn), pad_id, dtype=torch.long)
    att = torch.zeros((b, wc + wn), dtype=torch.long)
    for i, (c, r) in enumerate(zip(ctxs, reuse, strict=True)):
        new = c[r:]
        if r:
            ids[i, wc - r : wc] = torch.tensor(c[:r], dtype=torch.long)
            att[i, wc - r : wc] = 1
        ids[i, wc + wn - len(new) :] = torch.tensor(new, dtype=torch.long)
        att[i, wc + wn - len(new) :] = 1
    gc = gen_kwargs.get("generation_config")
    max_new = int(gen_kwargs.get("max_new_tokens") or (gc.max_new_tokens if gc is not None else 0) or 256)
    kwargs: dict[str, Any] = {"past_key_values": growing_cache(wc + wn + max_new)}
    if wc:
        ref = next(kv for kv, r in zip(caches, reuse, strict=True) if r)
        layers = []
        for li, (k0, v0) in enumerate(ref.layers):
            k = k0.new_zeros((b, k0.shape[0], wc, k0.shape[2]))
            v = v0.new_zeros((b, v0.shape[0], wc, v0.shape[2]))
            for i, (kv, r) in enumerate(zip(caches, reuse, strict=True)):
                if r:
                    k[i, :, wc - r :] = kv.layers[li][0][:, :r]
                    v[i, :, wc - r :] = kv.layers[li][1][:, :r]
            layers.append((k, v))
        kwargs["past_key_values"] = growing_cache(wc + wn + max_new, layers)
    gc = gen_kwargs.pop("generation_config", None)
    if gc is not None:  # one object, not an object plus loose arguments (transformers deprecates mixing)
        import copy

        gc = copy.copy(gc)
        gc.return_dict_in_generate = True
        gen_kwargs["generation_config"] = gc
    else:
        gen_kwargs["return_dict_in_generate"] = True
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=att.to(device), **gen_kwargs, **kwargs)
    seqs = out.sequences[:, wc + wn :].tolist()
    g = len(seqs[0]) if seqs else 0
    kv_layers = _cache_layers(out.past_key_values)
    stop = set(eos)
    comps, new_caches = [], []
    for i, (c, r) in enumerate(zip(ctxs, reuse, strict=True)):
        row = seqs[i]
        cut = next((k + 1 for k, t in enumerate(row) if t in stop), len(row))
        comp = row[:cut]
        m = min(len(comp), g - 1)
        n_new = len(c) - r
        idx = (
            list(range(wc - r, wc))
            + list(range(wc + wn - n_new, wc + wn))
            + list(range(wc + wn, wc + wn + m))
        )
        sel = torch.tensor(idx, dtype=torch.long, device=kv_layers[0][0].device)
        new_caches.append(
            EpisodeKV(
                list(c) + comp[:m],
                [(k[i].index_select(1, sel), v[i].index_select(1, sel)) for k, v in kv_layers],
            )
        )
        comps.append(comp)
    for kv in new_caches if prefix is not None else ():
        prefix.insert(kv.tokens, kv.layers)
    return comps, new_caches


def _fresh(ctx: list[int], kv: EpisodeKV | None) -> bool:
    """Whether a row has nothing of its own cached for its context."""
    return kv is None or _lcp(kv.tokens, ctx) == 0


def _common_heads(prefix, ctxs: list[list[int]], caches: list[EpisodeKV | None]) -> list[list[int]]:
    """The distinct whole-block heads that fresh rows share with another fresh row (each row's longest, at most
    all but its last token), shortest first. Sorted, a row's longest common prefix with any other row is the
    one with a neighbour."""
    rows = sorted((c for c, kv in zip(ctxs, caches, strict=True) if _fresh(c, kv)))
    heads: dict[tuple[int, ...], None] = {}
    for i, c in enumerate(rows):
        near = [_lcp(c, rows[j]) for j in (i - 1, i + 1) if 0 <= j < len(rows)]
        n = min(max(near, default=0), len(c) - 1) // prefix.block * prefix.block
        if n:
            heads[tuple(c[:n])] = None
    return sorted((list(h) for h in heads), key=len)


def _prefill_common(model, prefix, ctxs: list[list[int]], caches: list[EpisodeKV | None], device) -> None:
    """Put into the prefix cache, prefilled once each, the heads that rows with nothing cached share (eval's
    first round: every episode starts together, so none would find the system prompt and tool schemas that
    the others are about to prefill). Each head starts from what the cache already holds of it."""
    for head in _common_heads(prefix, ctxs, caches):
        n, layers = prefix.match(head, len(head), count=False)
        if n < len(head):
            prefix.insert(head, _prefill(model, head, device, n, layers))


def _from_prefix(prefix, ctx: list[int], kv: EpisodeKV | None) -> EpisodeKV | None:
    """The row's own cache, or when it shares nothing with the context, what the prefix cache holds."""
    if not _fresh(ctx, kv):
        return kv
    n, layers = prefix.match(ctx, len(ctx) - 1)
    return EpisodeKV(list(ctx[:n]), layers) if n else kv
