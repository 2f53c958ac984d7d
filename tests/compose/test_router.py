"""Router composition at serving speed: the classifier reuses the keys/values of its prompt's skill list (the
part every conversation shares) and runs the LM head on the last position only; on a CPU the merger keeps the
base and the merged weights resident and switches between them. Same probabilities, same decisions and the
same greedy tokens as a full classifier prefill with weights merged in place."""

from __future__ import annotations

import pytest
import torch
from float_paths import PROB_ATOL, assert_routes_close, assert_same_greedy

from trace_cli.stages.base import execute


@pytest.fixture(scope="module")
def router_art(composed_store):
    adapters = ["store://adapter/structured", "store://adapter/tool"]
    return execute("compose", {"method": "router", "adapters": adapters}, composed_store).main


def _conversations():
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import start

    long = start(make_env("shop"), 0).messages
    long = long + [{"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "Thanks!"}]
    return [long, start(make_env("shop"), 3).messages]


def _policy(art, tiny, *, head: bool, resident: bool):
    from trace_cli.compose.policy import load_composition_policy

    pol = load_composition_policy(art.path, tiny.hf, temperature=0.0, max_new_tokens=12)
    if not head:
        pol._head = None  # every classification prefills its whole prompt
    if not resident:  # the originals copied aside and each mix merged in place
        m = pol.merger
        m.resident = False
        m.original = {n: w.detach().clone() for n, w in m.original.items()}
    return pol


def test_classifier_head_is_reused_with_the_full_prefills_probabilities(router_art, tiny):
    from trace_cli.compose.router import classifier_prompt, classify

    pol = _policy(router_art, tiny, head=True, resident=True)
    pol.route(_conversations()[:1])  # makes the head
    assert pol._head is not None and len(pol._head[0]) > 20
    prompts = [classifier_prompt(pol.tok, pol.skills, c, 10) for c in _conversations()]
    fed: list[int] = []
    hook = pol.model.register_forward_pre_hook(
        lambda _m, _a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        fast = classify(pol.model, pol.tok, prompts, pol.label_ids, 1.0, pol._head)
        full = classify(pol.model, pol.tok, prompts, pol.label_ids, 1.0, None)
        alone = [classify(pol.model, pol.tok, [p], pol.label_ids, 1.0, None)[0] for p in prompts]
    finally:
        hook.remove()
    widths = [len(pol.tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert fed[0] == max(widths) - len(pol._head[0]) and fed[1] == max(widths)  # the head was not fed again
    assert torch.allclose(torch.tensor(fast), torch.tensor(full), atol=PROB_ATOL)
    assert torch.allclose(
        torch.tensor(fast), torch.tensor(alone), atol=PROB_ATOL
    )  # batching (padding) changes nothing
    # an unexpected prompt (not starting with the head) is fed whole
    other = classify(pol.model, pol.tok, ["Which skill?"], pol.label_ids, 1.0, pol._head)
    want = classify(pol.model, pol.tok, ["Which skill?"], pol.label_ids, 1.0, None)
    assert torch.allclose(torch.tensor(other), torch.tensor(want), atol=PROB_ATOL)


def test_router_routes_and_generates_as_a_full_prefill_with_in_place_merges(router_art, tiny):
    """The same decisions and greedy tokens as the classifier without its cached head and the merger writing
    each mix into the weights, over rounds that switch between the base (classifier) and a merged mix, and
    the base weights exactly restored."""
    from trace_cli.models.chat import render

    new = _policy(router_art, tiny, head=True, resident=True)
    old = _policy(router_art, tiny, head=False, resident=False)
    assert new.merger.resident
    convs = _conversations()
    prompts = [render(new.tok, c, None, add_generation_prompt=True) for c in convs]
    before = {n: w.detach().clone() for n, w in new.merger.original.items()}
    for mix in ({1: 1.0}, {2: 1.0}, None, {1: 0.5, 2: 0.5}):
        if mix is not None:  # force a merged mix (the tiny model's router may well pick the base)
            for pol in (new, old):
                pol.use_route(tuple(sorted(mix.items())))
                pol.route(convs)  # the classifier on the base, between merges
                pol.use_route(tuple(sorted(mix.items())))
            with torch.no_grad():
                a = new.model(torch.tensor([[5, 9, 13, 40]])).logits
                b = old.model(torch.tensor([[5, 9, 13, 40]])).logits
            # exact: the same forced mix merged by the same `_mixed` arithmetic, the same forward on it
            assert torch.equal(a, b), mix
        got, want = new.generate(prompts, conversations=convs), old.generate(prompts, conversations=convs)
        # the classifier's probabilities come from two paths (cached head vs full prefill): the mixing
        # weights agree to rounding, the experts chosen exactly; the greedy tokens generated under those
        # weights agree, or part only at a near tie
        assert_routes_close(new.last_routes, old.last_routes)
        for (_, ids_new, prompt_ids), (_, ids_old, _), route in zip(got, want, new.last_routes, strict=True):
            assert_same_greedy(ids_new, ids_old, _next_logits(new, route, prompt_ids, ids_new))
    assert [sorted(d["mix"]) for d in new.decisions] == [sorted(d["mix"]) for d in old.decisions]
    for d_new, d_old in zip(new.decisions, old.decisions, strict=True):
        for k, p in d_new["probs"].items():  # rounded to 4 digits: one rounding step apart at most
            assert abs(p - d_old["probs"][k]) <= 1e-4
        for k, a in d_new["mix"].items():
            assert abs(a - d_old["mix"][k]) <= 1e-4
    new.merger.apply({})
    for n, layer in new.merger.layers.items():
        assert torch.equal(layer.weight, before[n]), n  # exact: the originals restored, not recomputed


def _next_logits(pol, route, prompt_ids, ids):
    """The logits behind the greedy token at position i of `ids`, under the route's merged weights."""
    names = [s.name for s in pol.skills]
    key = tuple(sorted((names.index(n), a) for n, a in route.items() if n != "base"))

    def at(i):
        pol.use_route(key)
        with torch.no_grad():
            return pol.model(torch.tensor([list(prompt_ids) + list(ids[:i])])).logits[0, -1]

    return at
