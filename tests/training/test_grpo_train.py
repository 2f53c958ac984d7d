"""`train_grpo` on a tiny model: only the LoRA moves, one metrics row per optimizer step, checkpoints resume."""

from __future__ import annotations

import pytest
from grpo_helpers import grpo_spec, register_parity, set_env, tiny_model

from trace_cli.training.checkpoints import latest_checkpoint
from trace_cli.training.grpo import train_grpo
from trace_cli.training.metrics import metrics_rows, rollouts_after


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    set_env()
    register_parity()
    model_dir = tiny_model(tmp_path_factory)
    out = tmp_path_factory.mktemp("grpo-train")
    batch = {"num_generations": 4, "per_device_batch_size": 8, "gradient_accumulation_steps": 1}
    episode = {"max_turns": 2, "max_new_tokens": 10, "max_completion_length": 64}
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}
    run = {"max_steps": 3, "learning_rate": 0.05, "checkpoint_every": 2, "keep_model": True}
    spec = grpo_spec(model_dir, out / "ckpt", list(range(50)), lora=lora, **batch, **episode, **run)
    return spec, train_grpo(spec), model_dir


def test_only_lora_parameters_train(trained):
    import torch
    from safetensors.torch import load_file

    spec, result, model_dir = trained
    model = result.model
    named = dict(model.named_parameters())
    lora = {k: p for k, p in named.items() if "lora_" in k}
    assert lora and all(p.requires_grad for p in lora.values())
    assert all(not p.requires_grad for k, p in named.items() if "lora_" not in k)
    assert result.trainable_parameters == sum(p.numel() for p in lora.values())
    # lora_B starts at zero: a non-zero B means the optimizer moved the adapter
    moved = [k for k, p in lora.items() if "lora_B" in k and p.detach().abs().sum() > 0]
    assert moved, "no LoRA B matrix changed"
    base = load_file(str(model_dir / "model.safetensors"))
    for k, v in base.items():
        name = "base_model.model." + k.replace(".weight", ".base_layer.weight")
        p = named.get(name, named.get("base_model.model." + k))
        assert p is not None, k
        # exact: LoRA training never writes the base weights
        assert torch.equal(p.detach().cpu(), v), f"base weight {k} changed"


def test_one_metrics_row_per_optimizer_step(trained):
    spec, result, _ = trained
    assert result.global_step == spec.max_steps
    rows = metrics_rows(result.log_history, lambda s: rollouts_after(spec, s))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollouts"] == 3 * 8 and all(r["episodes"] == 8 for r in rows)
    for r in rows:
        for key in (
            "reward",
            "reward_std",
            "frac_reward_zero_std",
            "completion_length",
            "clipped_ratio",
            "learning_rate",
            "success",
        ):
            assert r[key] is not None, key
        assert r["kl"] is None  # beta = 0: no reference pass, no KL
    assert any(r["reward_std"] > 0 for r in rows), "the parity env should give groups with mixed rewards"


def test_adapter_saved_and_checkpoints_kept(trained):
    spec, result, _ = trained
    assert (result.adapter_dir / "adapter_config.json").is_file()
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()
    ck = latest_checkpoint(spec.output_dir)
    assert ck is not None and ck.name in ("checkpoint-2", "checkpoint-3")


def test_kl_is_logged_with_beta(tmp_path, tmp_path_factory):
    """beta > 0: TRL computes the reference log-probs with the adapter disabled and logs the KL."""
    register_parity()
    batch = {"num_generations": 2, "per_device_batch_size": 4, "gradient_accumulation_steps": 1}
    episode = {"max_turns": 1, "max_new_tokens": 6, "max_completion_length": 6}
    lora = {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    run = {"max_steps": 1, "beta": 0.04, "checkpoint_every": 0}
    model = tiny_model(tmp_path_factory)
    spec = grpo_spec(model, tmp_path / "ckpt", list(range(10)), lora=lora, **batch, **episode, **run)
    rows = metrics_rows(train_grpo(spec).log_history, lambda s: rollouts_after(spec, s))
    assert len(rows) == 1 and rows[0]["kl"] is not None and rows[0]["kl"] >= 0
