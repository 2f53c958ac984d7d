"""Automatic prefix caching: keys/values of token prefixes kept across requests, turns and episodes.

As in vLLM's automatic prefix caching, a context is cut into fixed-size blocks of tokens and each block is
keyed by its tokens and the key of the block before it (a chain), so a key stands for the whole prefix up to
the end of its block. A new context reuses the keys/values of its longest run of cached whole blocks and
feeds only the rest: the system prompt and tool schemas that every conversation of a τ²-bench domain shares
are prefilled once, and a conversation's next turn feeds only what was added since its last one.

Blocks are evicted least recently used first under a memory cap; a lookup or an insert marks a chain's
blocks used from its last block to its first, so a shared head outlives the tails that hang from it.
Positions: a cached prefix always starts at position 0, so its keys carry the rotary positions a fresh
prefill would give them. Not for models whose keys/values depend on more than the tokens before them (a
router composition re-merges weights per decision; a gated MoE with context gates keeps a running state).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

BLOCK = 32  # tokens per block


def has_sliding_layers(config) -> bool:
    """Whether a model has sliding-window attention layers: their cache keeps only the window, so a prefix's
    keys/values cannot be cut into blocks and reused (nor joined into a left-padded batch)."""
    get = getattr(config, "get_text_config", None)
    c = get() if callable(get) else config
    return any("sliding" in str(t) for t in getattr(c, "layer_types", None) or [])


@dataclass
class _Block:
    parent: int
    tokens: tuple[int, ...]
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each [heads, BLOCK, head_dim]
    nbytes: int


class PrefixCache:
    """Keys/values per block of `block` tokens, chained by prefix, LRU-evicted above `max_bytes`."""

    def __init__(self, max_bytes: int, block: int = BLOCK):
        self.max_bytes, self.block = max_bytes, block
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self.bytes = 0
        self.hit_tokens = 0  # tokens served from the cache so far
        self.evicted = 0  # blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def _chain(self, tokens: list[int], n_blocks: int):
        """(key, parent key, block tokens) of the first `n_blocks` blocks of `tokens`."""
        parent, b = 0, self.block
        for i in range(n_blocks):
            toks = tuple(tokens[i * b : (i + 1) * b])
            key = hash((parent, toks))
            yield key, parent, toks
            parent = key

    def _touch(self, keys: list[int]) -> None:
        for k in reversed(keys):  # the chain's head ends most recent: evicted last
            self._blocks.move_to_end(k)

    def match(
        self, tokens: list[int], limit: int | None = None, *, count: bool = True
    ) -> tuple[int, list[tuple[Any, Any]] | None]:
        """(n, per-layer (keys, values) [heads, n, head_dim]) of the longest cached prefix of whole blocks of
        `tokens`, at most `limit` tokens long; (0, None) when none is cached. `count`: add n to `hit_tokens`."""
        import torch

        limit = len(tokens) if limit is None else min(limit, len(tokens))
        found: list[tuple[int, _Block]] = []
        for key, parent, toks in self._chain(tokens, max(0, limit) // self.block):
            blk = self._blocks.get(key)
            if blk is None or blk.parent != parent or blk.tokens != toks:
                break
            found.append((key, blk))
        if not found:
            return 0, None
        self._touch([k for k, _ in found])
        n = len(found) * self.block
        self.hit_tokens += n if count else 0
        layers = [
            (
                torch.cat([blk.layers[li][0] for _, blk in found], -2),
                torch.cat([blk.layers[li][1] for _, blk in found], -2),
            )
            for li in range(len(found[0][1].layers))
        ]
        return n, layers

    def insert(self, tokens: list[int], layers: list[tuple[Any, Any]], offset: int = 0) -> None:
        """Cache the whole blocks of `tokens` whose keys/values `layers` hold ([heads, len, head_dim] per
        layer, position 0 = token `offset`, a multiple of the block size; the blocks before it must be
        cached already, else nothing is)."""
        if not layers or self.max_bytes <= 0:
            return
        n_blocks = min(len(tokens), offset + layers[0][0].shape[-2]) // self.block
        keys = []
        for i, (key, parent, toks) in enumerate(self._chain(tokens, n_blocks)):
            keys.append(key)
            if key in self._blocks:
                continue
            a = i * self.block - offset
            if a < 0:
                return  # a block before `offset` is not cached: the chain cannot be completed
            kv = [
                (k[..., a : a + self.block, :].clone(), v[..., a : a + self.block, :].clone())
                for k, v in layers
            ]
            nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
            self._blocks[key] = _Block(parent, toks, kv, nbytes)
            self.bytes += nbytes
        self._touch(keys)
        while self.bytes > self.max_bytes and self._blocks:
            _, blk = self._blocks.popitem(last=False)
            self.bytes -= blk.nbytes
            self.evicted += 1

    def clear(self) -> None:
        """Forget every block (the weights changed: a GRPO optimizer step, a re-merge)."""
        self._blocks.clear()
        self.bytes = 0

    def stats(self) -> dict[str, int]:
        return {"blocks": len(self._blocks), "bytes": self.bytes, "hit_tokens": self.hit_tokens}
