"""`HFPolicy`: batched left-padded generation, what it counts and records per turn."""

from __future__ import annotations

import pytest
from tinymodel import noisy_copy

from trace_cli.compose.policy import load_policy
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout, start
from trace_cli.models.chat import render
from trace_cli.models.refs import resolve_model


def test_records_the_exact_prompt_and_completion_tokens(noisy_ref):
    policy = load_policy(noisy_ref, temperature=0.0, max_new_tokens=12)
    policy.record_tokens = True
    eps = rollout(policy, lambda: make_env("shop"), [(s, 0) for s in range(4)], max_turns=3, batch_size=4)
    tok = policy.tok
    for ep in eps:
        turns = [t for t in ep.turns if "prompt_ids" in t]
        assert len(turns) == ep.n_actions
        assert sum(len(t["completion_ids"]) for t in turns) == ep.gen_tokens
        k = 0
        for i, m in enumerate(ep.messages):
            if m["role"] != "assistant":
                continue
            t = turns[k]
            k += 1
            # the prompt is the unpadded rendering of the history (no pad tokens, left padding removed)
            prompt = render(tok, ep.messages[:i], ep.tools, add_generation_prompt=True)
            assert t["prompt_ids"] == tok(prompt, add_special_tokens=False)["input_ids"]
            assert tok.pad_token_id not in t["prompt_ids"]
            assert 1 <= len(t["completion_ids"]) <= 12


def test_a_turn_without_eos_keeps_every_generated_token(tiny_model, tmp_path):
    """A model that emits the pad token id mid-turn: those tokens were generated and count (they used to be
    dropped as if they were padding, undercounting tokens and cutting real ones off the end of the turn)."""
    ref = resolve_model(
        str(noisy_copy(tiny_model, tmp_path / "hf", tool_call_bias=50.0, bias_token="<|endoftext|>"))
    )
    policy = load_policy(ref, temperature=0.0, max_new_tokens=5)
    policy.record_tokens = True
    states = [start(make_env("shop"), s) for s in range(2)]
    turns = policy.act(states)
    pad = policy.tok.pad_token_id
    for s, turn in zip(states, turns, strict=True):
        assert s.gen_tokens == 5
        assert s.turns[-1]["completion_ids"] == [pad] * 5
        assert turn.raw == "<|endoftext|>" * 5


def test_sampling_needs_top_p_and_a_seed(noisy_ref):
    """`trace serve` loads its policy without top_p or seed (each request brings its own): such a policy
    samples no turn with values no config gave, it says what is missing; given them, it samples."""
    policy = load_policy(noisy_ref, temperature=0.7, max_new_tokens=4)
    with pytest.raises(ValueError, match="top_p and a seed"):
        policy.act([start(make_env("shop"), 0)])
    policy = load_policy(noisy_ref, temperature=0.7, top_p=1.0, seed=0, max_new_tokens=4)
    assert len(policy.act([start(make_env("shop"), 0)])) == 1
