"""Multi-turn KV-cache reuse (models.kvcache): each turn feeds only the new tokens, and greedy episodes are the
same as with a full re-prefill every turn, for eval's HFPolicy and GRPO's TokenPolicy, at mixed cached lengths
(the noisy tiny model: episodes run different numbers of turns and the batch is refilled mid-run)."""

from __future__ import annotations

import pytest
import tinymodel
from tinymodel import noisy_copy

from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout
from trace_cli.models.refs import load_hf, resolve_model

SEEDS = list(range(8))
UNCUT = {"top_p": 1.0, "top_k": 0, "seed": 0}  # TokenPolicy sampling with no top-p/top-k cut


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    tiny = tinymodel.tiny(tmp_path_factory)
    ref = resolve_model(str(noisy_copy(tiny, tmp_path_factory.mktemp("noisy-kv") / "hf")))
    return load_hf(ref)


def _fed_widths(model):
    """Record the positions every forward call computes, pads included (> 1 per row: a prefill; a batch of
    decoding steps records its batch size)."""
    widths: list[int] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        widths.append(ids.numel() if ids is not None and ids.shape[1] > 1 else -1)

    # a hook, not a wrapper: generate inspects forward's signature (position ids from the mask)
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    return widths, handle.remove


def _episodes(policy, batch_size=3):
    jobs = [(s, 0) for s in SEEDS]
    return rollout(policy, lambda: make_env("shop"), jobs, max_turns=4, batch_size=batch_size)


def test_hf_policy_reuse_gives_the_same_episodes_and_feeds_less(noisy):
    from trace_cli.agents.hf import HFPolicy

    model, tok = noisy
    widths, restore = _fed_widths(model)
    try:
        reused = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12, reuse_cache=True))
        fed_reuse = sum(w for w in widths if w > 1)
        widths.clear()
        full = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12, reuse_cache=False))
        fed_full = sum(w for w in widths if w > 1)
    finally:
        restore()
    assert [e.messages for e in reused] == [e.messages for e in full]
    assert [e.gen_tokens for e in reused] == [e.gen_tokens for e in full]
    assert max(e.n_actions for e in full) > 1  # multi-turn: there was something to reuse
    assert fed_reuse < fed_full / 2, (fed_reuse, fed_full)


def test_token_policy_reuse_gives_the_same_turns(noisy):
    from trace_cli.agents.token_history import TokenPolicy

    model, tok = noisy

    def turns(reuse):
        pol = TokenPolicy(
            model, tok, temperature=0.0, **UNCUT, max_new_tokens=12, budget=400, reuse_cache=reuse
        )
        return [
            [(t["prompt_ids"], t["completion_ids"]) for t in e.turns] for e in _episodes(pol, batch_size=4)
        ]

    a, b = turns(True), turns(False)
    assert a == b and max(len(t) for t in a) > 1


def test_cache_is_dropped_with_the_episode(noisy):
    """The cache lives on the episode state, so finished episodes free theirs (results keep none)."""
    from trace_cli.agents.hf import HFPolicy

    model, tok = noisy
    eps = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=8))
    assert all(not hasattr(e, "kv") for e in eps)


def test_a_prefix_cache_shared_by_episodes_gives_the_same_episodes_and_feeds_less(noisy):
    """With a prefix cache, an episode's first turn starts from what earlier episodes prefilled of the same
    prompt (the shop's system prompt and tools): the same greedy episodes, fewer tokens fed."""
    from trace_cli.agents.hf import HFPolicy
    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.models.prefix_cache import PrefixCache

    model, tok = noisy
    widths, restore = _fed_widths(model)
    try:
        plain = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12))
        fed_plain = sum(w for w in widths if w > 1)
        widths.clear()
        pc = PrefixCache(64 << 20)
        cached = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12, prefix_cache=pc))
        fed_cached = sum(w for w in widths if w > 1)
    finally:
        restore()
    # exact: greedy episodes of the noisy model (large random weights: wide logit margins; not checked here)
    assert [e.messages for e in cached] == [e.messages for e in plain]
    # the padded width of a batch is its longest row's: a fresh episode beside cached ones still widens it
    assert pc.hit_tokens >= 5 * pc.block and fed_cached < fed_plain * 0.9, (
        pc.hit_tokens,
        fed_cached,
        fed_plain,
    )

    def turns(prefix):
        pol = TokenPolicy(
            model, tok, temperature=0.0, **UNCUT, max_new_tokens=12, budget=400, prefix_cache=prefix
        )
        return [
            [(t["prompt_ids"], t["completion_ids"]) for t in e.turns] for e in _episodes(pol, batch_size=2)
        ]

    pc = PrefixCache(64 << 20)
    assert turns(pc) == turns(None) and pc.hit_tokens > 0
    pc.clear()
    assert len(pc) == 0 and pc.bytes == 0


def test_episodes_that_start_together_prefill_their_shared_prompt_once(noisy):
    """Eval's first round: every episode starts at once, so none finds in the prefix cache what the others
    are about to prefill. The heads they share (system prompt, tool schemas) are prefilled once into the
    cache first: the same greedy episodes, fewer tokens fed."""
    from trace_cli.agents.hf import HFPolicy
    from trace_cli.models.prefix_cache import PrefixCache

    model, tok = noisy
    fed: list[int] = []

    def hook(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        w = ids.shape[1]  # prefill tokens fed (pads left out)
        fed.append(0 if w == 1 else ids.numel() if mask is None else int(mask[:, -w:].sum()))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        plain = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12), batch_size=len(SEEDS))
        fed_plain, fed[:] = sum(fed), []
        pc = PrefixCache(64 << 20)
        policy = HFPolicy(model, tok, temperature=0.0, max_new_tokens=12, prefix_cache=pc)
        cached = _episodes(policy, batch_size=len(SEEDS))
        fed_cached = sum(fed)
    finally:
        handle.remove()
    # exact: greedy episodes of the noisy model (large random weights: wide logit margins; not checked here)
    assert [e.messages for e in cached] == [e.messages for e in plain]
    # no episode started after another had finished: every hit came from the shared heads prefilled first
    assert pc.hit_tokens >= len(SEEDS) * 4 * pc.block, pc.hit_tokens
    assert fed_cached < fed_plain * 0.9, (fed_cached, fed_plain)


def test_an_episode_that_starts_beside_running_ones_does_not_widen_their_prefill(noisy):
    """A refilled slot's whole prompt is prefilled alone, so the rows beside it (a few new tokens each) are not
    padded to its width: the positions computed stay close to the tokens fed, with the same episodes."""
    from trace_cli.agents.hf import HFPolicy

    model, tok = noisy
    shapes: list[tuple[int, int, int]] = []

    def hook(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        w = ids.shape[1]
        if w > 1:
            shapes.append((ids.numel(), ids.numel() if mask is None else int(mask[:, -w:].sum()), w))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        eps = _episodes(HFPolicy(model, tok, temperature=0.0, max_new_tokens=12), batch_size=3)
    finally:
        handle.remove()
    computed, fed = sum(s[0] for s in shapes), sum(s[1] for s in shapes)
    assert len(eps) == len(SEEDS) > 3  # slots were refilled while other episodes ran
    assert computed < 1.3 * fed, (computed, fed, shapes)
