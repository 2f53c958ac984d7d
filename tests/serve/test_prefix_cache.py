"""Automatic prefix caching and chunked prefill in the serve engine: the same greedy tokens with and without
them (a model with large random weights, whose greedy output depends on every position of its context), over
multi-turn conversations that share a system prompt; the cache's blocks, chains and LRU eviction."""

from __future__ import annotations

import asyncio

import pytest
import tinymodel

torch = pytest.importorskip("torch")


def _kv(n: int, start: int = 0, layers: int = 2):
    """Per layer (keys, values) [heads 2, n, dim 4] whose values name their position."""
    pos = torch.arange(start, start + n, dtype=torch.float32)
    k = pos.view(1, n, 1).expand(2, n, 4).clone()
    return [(k + li, -k - li) for li in range(layers)]


def test_blocks_chain_by_prefix_and_the_least_recently_used_go_first():
    from trace_cli.models.prefix_cache import PrefixCache

    pc = PrefixCache(max_bytes=10**9, block=4)
    toks = list(range(100, 110))  # 2 whole blocks and 2 tokens
    pc.insert(toks, _kv(10))
    assert len(pc) == 2
    n, layers = pc.match(toks + [1, 2])
    # exact: the cache hands back slices of the tensors it was given (keys of positions 0..7, layer 1)
    assert n == 8 and torch.equal(layers[1][0], _kv(8)[1][0])
    assert pc.match(toks, limit=7)[0] == 4  # whole blocks within the limit
    assert pc.match([100, 101, 102, 999, 104])[0] == 0  # the first block differs
    assert pc.match([0] * 4 + toks[4:8])[0] == 0  # the same second block after another first one
    # an insert that starts after cached blocks adds only the new ones
    pc.insert(toks + [110, 111, 112, 113], _kv(6, start=8), offset=8)
    n, layers = pc.match(toks + [110, 111, 112, 113, 0])
    # exact: slices of the stored tensors, no arithmetic
    assert n == 12 and torch.equal(layers[0][1], _kv(12)[0][1])
    # under a cap of 3 blocks, the tail of the oldest chain is evicted first, its head kept
    block_bytes = pc.bytes // 3
    small = PrefixCache(max_bytes=3 * block_bytes, block=4)
    small.insert(toks[:8], _kv(8))  # A: 2 blocks
    small.insert([7] * 8, _kv(8))  # B: 2 blocks -> A's second block goes
    assert small.evicted == 1 and small.match(toks)[0] == 4 and small.match([7] * 9)[0] == 8
    assert PrefixCache(0, block=4).insert(toks, _kv(10)) is None and len(PrefixCache(0)) == 0


@pytest.fixture(scope="module")
def noisy_policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.agents.hf import HFPolicy

    path = tinymodel.noisy_copy(tinymodel.tiny(tmp_path_factory), tmp_path_factory.mktemp("noisy") / "m")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return HFPolicy(
        model, AutoTokenizer.from_pretrained(path), temperature=0.0, max_new_tokens=128, max_context=4096
    )


SYSTEM = {"role": "system", "content": "You are a shop agent. Policy: " + "verify the order id first. " * 30}


def _conversations(engine, turns: int):
    """Two conversations with the same system prompt, `turns` user turns each, greedy, run concurrently as a
    client would: each turn's prompt is the conversation so far. Every completion's ids, in order."""

    async def one(k: int) -> list[list[int]]:
        msgs = [SYSTEM]
        got = []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"Customer {k}, question {t}: where is order #W{k}{t}?"})
            text, ids, _, _ = await engine.generate(engine.render(msgs, None), (0.0, 1.0, 12))
            got.append(ids)
            msgs.append({"role": "assistant", "content": text.split("<|im_end|>")[0]})
        return got

    async def run():
        engine.start()
        try:
            return await asyncio.gather(one(0), one(1))
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_the_cache_and_chunked_prefill_give_the_same_greedy_tokens(noisy_policy):
    from trace_cli.serve.engine import Engine

    plain = Engine(noisy_policy, "m", prefix_cache_mib=0, prefill_chunk=0)
    want = _conversations(plain, 3)
    cached = Engine(noisy_policy, "m", prefix_cache_mib=64, prefill_chunk=16)
    got = _conversations(cached, 3)
    assert got == want
    assert len({tuple(ids) for conv in want for ids in conv}) > 3  # the completions differ: a real check
    s, p = cached.stats(), plain.stats()
    assert p["cached_tokens"] == 0 and s["cached_tokens"] > 0
    assert s["prefill_tokens"] + s["cached_tokens"] == p["prefill_tokens"]  # every prompt token, once
    assert s["prefill_tokens"] < p["prefill_tokens"] / 2  # the shared system prompt and earlier turns
    assert s["prefill_chunks"] > p["prefill_chunks"]  # 16 tokens a pass
