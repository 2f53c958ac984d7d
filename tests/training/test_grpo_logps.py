"""GRPO's per-group log-probabilities (`shared_prompt_logps`): the same numbers and LoRA gradients as a plain
padded forward of every row, with each group's prompt run once; the
rollout's first-turn prefill runs once per group."""

from __future__ import annotations

import pytest
from grpo_helpers import set_env, tiny_model

from trace_cli.training.logps import shared_prompt_logps

UNCUT = {"top_p": 1.0, "top_k": 0, "seed": 0}  # TokenPolicy sampling with no top-p/top-k cut


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory):
    set_env()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model(tmp_path_factory), dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # lora_B starts at zero: move it so the adapter changes the numbers
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return model


def _batch(vocab: int):
    """Two groups (prompts of 7 and 4 tokens, left-padded) of 3 and 2 rows, completions of different lengths
    (right-padded), and a score mask that leaves out some 'environment' tokens; rows interleaved."""
    import torch

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, vocab, (7,), generator=g), torch.randint(5, vocab, (4,), generator=g)]
    rows = [(0, 5), (1, 3), (0, 9), (1, 6), (0, 2)]
    pw, cw = 7, 9
    ids = torch.zeros((len(rows), pw + cw), dtype=torch.long)
    att = torch.zeros_like(ids)
    score = torch.zeros((len(rows), cw), dtype=torch.long)
    for r, (gi, n) in enumerate(rows):
        p = prompts[gi]
        ids[r, pw - len(p) : pw] = p
        att[r, pw - len(p) : pw] = 1
        ids[r, pw : pw + n] = torch.randint(5, vocab, (n,), generator=g)
        att[r, pw : pw + n] = 1
        score[r, :n] = 1
        score[r, 1] = 0  # an environment token: attended to, never scored
    return ids, att, score, cw


def _reference(model, ids, att, keep: int, temperature: float):
    import torch

    pos = (att.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -keep - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, ids[:, -keep:, None]).squeeze(-1)


def _lora_grads(model) -> dict[str, object]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def test_shared_prompt_logps_match_a_padded_forward(lora_model):
    import torch

    model = lora_model
    ids, att, score, cw = _batch(model.config.vocab_size)
    real = att[:, -cw:].bool() & score.bool()
    weights = torch.randn(real.shape, generator=torch.Generator().manual_seed(2))

    model.zero_grad()
    ref = _reference(model, ids, att, cw, 0.7)
    (ref * real * weights).sum().backward()
    ref_grads = _lora_grads(model)

    model.zero_grad()
    got, ent = shared_prompt_logps(model, ids, att, cw, 0.7, score_mask=score, entropy=True)
    (got * real * weights).sum().backward()
    got_grads = _lora_grads(model)

    assert torch.allclose(got[real], ref[real].detach(), atol=1e-4), (got[real] - ref[real]).abs().max()
    assert torch.all(got[~real] == 0) and torch.all(ent[~real] == 0)
    assert torch.all(ent[real] > 0)
    assert ref_grads.keys() == got_grads.keys() and len(ref_grads) > 0
    for n, gr in ref_grads.items():
        assert torch.allclose(got_grads[n], gr, atol=1e-4, rtol=1e-3), n
    model.zero_grad()


def test_nothing_scored_still_reaches_the_lora_as_zero(lora_model):
    import torch

    model = lora_model
    ids, att, score, cw = _batch(model.config.vocab_size)
    model.zero_grad()
    got, _ = shared_prompt_logps(model, ids, att, cw, 1.0, score_mask=torch.zeros_like(score))
    assert torch.all(got == 0) and got.requires_grad
    got.sum().backward()
    assert all(float(g.abs().sum()) == 0 for g in _lora_grads(model).values())
    model.zero_grad()


def test_group_first_turn_prefill_runs_once(tmp_path_factory):
    """Greedy TokenPolicy rollouts of two seeds x 3 copies: the same episodes as without cache reuse, and the
    first prompt of each seed is prefilled once (one unbatched forward per seed) instead of once per copy."""
    set_env()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout

    path = tiny_model(tmp_path_factory)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    calls: list[tuple[int, int]] = []
    handle = model.register_forward_pre_hook(
        lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    jobs = [(s, t) for s in (3, 4) for t in range(3)]

    def run(reuse: bool):
        calls.clear()
        pol = TokenPolicy(
            model, tok, max_new_tokens=8, budget=200, temperature=0.0, **UNCUT, reuse_cache=reuse
        )
        res = rollout(pol, lambda: make_env("shop"), jobs, max_turns=3, batch_size=6)
        return [r.turns for r in res], list(calls)

    try:
        shared, shared_calls = run(True)
        full, _ = run(False)
    finally:
        handle.remove()
    assert [[t["completion_ids"] for t in e] for e in shared] == [
        [t["completion_ids"] for t in e] for e in full
    ]
    first = [len(e[0]["prompt_ids"]) for e in shared]
    prefills = [c for c in shared_calls if c[0] == 1 and c[1] + 1 in first]
    assert len(prefills) == 2, shared_calls[:4]
