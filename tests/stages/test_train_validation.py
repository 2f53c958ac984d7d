"""`validation`: a GRPO adapter is evaluated greedily on its environment's validation seeds before the first step
and every `every` steps; the best is kept (the step-0 one is the untrained LoRA: the base), training stops after
`patience` evaluations without a new best, and the summary counts the validation episodes (to be charged)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpo_helpers import grpo_config, register_parity, set_env, tiny_model
from safetensors.torch import load_file

from trace_cli.errors import UsageError
from trace_cli.stages.base import execute
from trace_cli.stages.train import prepare
from trace_cli.store import Store
from trace_cli.training.validation import validation_until

VAL = "900:906"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory)


def _lora_b(art) -> list:
    w = load_file(str(art.path / "adapter" / "adapter_model.safetensors"))
    return [v for k, v in w.items() if "lora_B" in k]


def test_stops_when_no_evaluation_beats_the_first_and_keeps_the_base(model_dir, tmp_path):
    """min_delta 1: nothing can beat the step-0 evaluation, so two evaluations later (every step) training stops
    at step 2 of 6, and the adapter stored is the untrained LoRA (B = 0), not the one trained for 2 steps."""
    set_env()
    register_parity()
    store = Store(tmp_path / "store")
    val = {"seeds": VAL, "every": 1, "patience": 2, "min_delta": 1.0}
    art = execute(
        "train", grpo_config(model_dir, max_steps=6, validation=val, snapshot_steps=[1, 4]), store
    ).main
    v = art.summary["validation"]
    assert [h["step"] for h in v["history"]] == [0, 1, 2]
    assert v["best_step"] == 0 and v["stopped_at"] == 2 and art.summary["steps"] == 2
    assert v["episodes"] == 3 * 6 and all(h["episodes"] == 6 for h in v["history"])
    assert _lora_b(art) and all(b.abs().max().item() == 0 for b in _lora_b(art))
    # the snapshots are what runs of 1 and 4 steps keep: the best so far (here the base), each charged its own
    snaps = art.summary["snapshots"]
    assert sorted(snaps) == ["1", "4"]
    one, four = (store.resolve(snaps[n], kind="adapter") for n in ("1", "4"))
    assert one.summary["validation"]["episodes"] == 12 and four.summary["validation"]["episodes"] == 18
    assert four.summary["validation"]["stopped_at"] == 2 and one.summary["validation"]["stopped_at"] is None
    assert all(b.abs().max().item() == 0 for b in _lora_b(four))


def test_without_validation_the_last_adapter_is_stored(model_dir, tmp_path):
    """The control of the test above: the same 2 steps without validation store a trained (B != 0) adapter."""
    set_env()
    register_parity()
    art = execute("train", grpo_config(model_dir, max_steps=2), Store(tmp_path / "store")).main
    assert art.summary["validation"] is None
    assert any(b.abs().max().item() > 0 for b in _lora_b(art))


def test_validation_seeds_must_not_be_training_seeds(model_dir, tmp_path):
    set_env()
    register_parity()
    with pytest.raises(UsageError, match="overlap the training seeds"):
        prepare(grpo_config(model_dir, validation={"seeds": "130:150"}), Store(tmp_path / "store"))
    with pytest.raises(UsageError, match="validation"):
        prepare(grpo_config(model_dir, validation={"every": 2}), Store(tmp_path / "store"))
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("manifest.yaml"))


def test_validation_until_keeps_the_evaluations_a_shorter_run_made():
    hist = [{"step": s, "reward": r, "success": r, "episodes": 4} for s, r in ((0, 0.2), (2, 0.5), (4, 0.4))]
    full = {
        "history": hist,
        "best_step": 2,
        "best_reward": 0.5,
        "since_best": 1,
        "stopped_at": 4,
        "episodes": 12,
    }
    assert validation_until(full, 1) == {
        "history": hist[:1],
        "best_step": 0,
        "best_reward": 0.2,
        "since_best": 0,
        "stopped_at": None,
        "episodes": 4,
    }
    three = validation_until(full, 3)
    assert three["best_step"] == 2 and three["episodes"] == 8 and three["stopped_at"] is None
    assert validation_until(full, 9)["stopped_at"] == 4 and validation_until(None, 3) is None
