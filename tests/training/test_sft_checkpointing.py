"""SFT with gradient checkpointing (what a long demonstration needs on a GPU): autograd keeps far fewer activations
(the layers' are recomputed in the backward pass), and the run trains what it trains without (same losses, same
weights)."""

from __future__ import annotations

import pytest
import tinymodel  # noqa: E402


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    from transformers import AutoTokenizer

    from trace_cli.training.sft import demonstrations, fit_examples

    tiny = tinymodel.tiny(tmp_path_factory)
    tok = AutoTokenizer.from_pretrained(tiny.hf)
    demos = demonstrations("shop", [100000 + i for i in range(3)], set(), deficit_rate=1.0, seed=0)
    ex = fit_examples(tok, demos, 4096, 4096, "assistant")
    assert ex
    return tiny, tok, ex


def _train(tiny, tok, examples, checkpointing: bool, lora: bool):
    import torch
    from transformers import AutoModelForCausalLM

    from trace_cli.training import lora_config
    from trace_cli.training.sft import SFTSettings, train_sft

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny.hf)
    if lora:
        from peft import get_peft_model

        model = get_peft_model(
            model, lora_config({"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"})
        )
    saved = [0]  # elements autograd keeps from the forward passes for the backward ones

    def pack(t):
        saved[0] += t.numel()
        return t

    settings = SFTSettings(
        epochs=2,
        learning_rate=0.01,
        batch_size=1,
        seed=0,
        max_minutes=None,
        gradient_checkpointing=checkpointing,
    )
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        metrics = train_sft(model, tok, examples, settings)
    weights = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    return metrics, weights, saved[0], model


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointing_recomputes_layers_and_trains_the_same(examples, lora):
    tiny, tok, ex = examples
    plain, w_plain, kept_plain, _ = _train(tiny, tok, ex, False, lora)
    ckpt, w_ckpt, kept_ckpt, model = _train(tiny, tok, ex, True, lora)
    steps = len(plain)
    assert steps == len(ckpt) >= 3
    assert kept_ckpt < kept_plain / 2  # the layers' activations are recomputed, not kept
    assert [m["loss"] for m in ckpt] == pytest.approx([m["loss"] for m in plain], rel=1e-5, abs=1e-6)
    for k, v in w_plain.items():
        assert (w_ckpt[k] - v).abs().max().item() < 1e-5, k
    assert not model.is_gradient_checkpointing  # the model leaves the run as it came
