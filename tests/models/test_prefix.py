"""Prefix preservation: what the model is prompted with at turn k is a prefix of the transcript it is trained on.

For every assistant message k of a replayed shop episode,
render(messages[:k], add_generation_prompt=True) is a prefix of render(messages[:k+1]). SFT's assistant-only
loss and GRPO's per-turn token accounting both depend on it. It must also hold for token ids, or training
would teach continuations the model never meets at generation time; that is a property of the tokenizer
(no BPE merge may cross the end of the generation prompt).
"""

from __future__ import annotations

import json

import pytest

from trace_cli.agents.base import text_turn
from trace_cli.agents.scripted import RandomPolicy
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import replay, rollout
from trace_cli.models.chat import render

SEEDS = range(12)  # two tasks of each of the six families


def _episodes():
    """Reference solutions, deficit demonstrations (what SFT trains on) and random-policy episodes (tool errors)."""
    eps = []
    for s in SEEDS:
        env = make_env("shop")
        env.reset(s)
        plans = [env.reference_actions()]
        caps = env.task_metadata()["required_capabilities"]
        if caps:
            plans.append(env.demonstration(set(caps)))
        eps += [replay(make_env("shop"), s, p) for p in plans]
    eps += rollout(RandomPolicy(1), lambda: make_env("shop"), [(s, 0) for s in range(6)], max_turns=6)
    eps += rollout(_Narrating(), lambda: make_env("shop"), [(s, 0) for s in range(6)], max_turns=12)
    return eps


class _Narrating:
    """Raw model-style output: the reference solution with a sentence before each tool call."""

    def begin(self, state):
        state.turns.append({"plan": state.env.reference_actions()})

    def act(self, states):
        out = []
        for s in states:
            a = s.turns[0]["plan"].pop(0) if s.turns[0]["plan"] else {"content": "Goodbye."}
            if "name" in a:
                call = json.dumps({"name": a["name"], "arguments": a["arguments"]})
                out.append(f"I will call {a['name']} now.\n<tool_call>\n{call}\n</tool_call><|im_end|>")
            else:
                out.append(a["content"] + "<|im_end|>")
        return [text_turn(t) for t in out]


@pytest.fixture(scope="module")
def episodes():
    eps = _episodes()
    assert len({e.metadata["family"] for e in eps}) == 6
    return eps


def _pairs(tok, eps):
    for ep in eps:
        for k, m in enumerate(ep.messages):
            if m["role"] == "assistant":
                prompt = render(tok, ep.messages[:k], ep.tools, add_generation_prompt=True)
                full = render(tok, ep.messages[: k + 1], ep.tools, add_generation_prompt=False)
                yield ep, k, prompt, full


def test_render_prefix_preserving_text(tiny_model, episodes):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model.hf)
    n = 0
    for ep, k, prompt, full in _pairs(tok, episodes):
        assert full.startswith(prompt), (ep.task_id, k)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        n += 1
    assert n > 50
    # and the full transcript ends with the turn the agent produced
    ep = episodes[0]
    last = max(i for i, m in enumerate(ep.messages) if m["role"] == "assistant")
    text = render(tok, ep.messages[: last + 1], ep.tools, add_generation_prompt=False)
    assert text.rstrip().endswith(ep.messages[last]["content"] + "<|im_end|>")


def _assert_token_prefix(tok, eps):
    bad = []
    for ep, k, prompt, full in _pairs(tok, eps):
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        f = tok(full, add_special_tokens=False)["input_ids"]
        if f[: len(p)] != p:
            bad.append((ep.task_id, k, tok.convert_ids_to_tokens(f[len(p) - 2 : len(p) + 2])))
    assert not bad, (
        f"{len(bad)} turns whose prompt tokens are not a prefix of the transcript tokens: {bad[:3]}"
    )


def test_render_prefix_preserving_tokens(tiny_model, episodes):
    from transformers import AutoTokenizer

    _assert_token_prefix(AutoTokenizer.from_pretrained(tiny_model.hf), episodes)


def test_tokenizer_never_merges_across_the_generation_prompt(episodes):
    """A tokenizer trained on a larger corpus learns merges like "\\nYour"; the builder must prevent them
    from crossing the newline that ends the generation prompt (it isolates newlines)."""
    from trace_cli.envs.corpus import corpus_episodes
    from trace_cli.models.builder import build_tokenizer, corpus

    tok = build_tokenizer(corpus(corpus_episodes(["shop"], 40, 0)), 1024)
    _assert_token_prefix(tok, episodes)
