"""`snapshot_steps`: one GRPO run stores the adapter after the listed steps as adapter artifacts of their own, each
what the same config with that many steps trains (same id, same weights), so a learning curve costs one run."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from grpo_helpers import grpo_config, register_parity, set_env, tiny_model  # noqa: E402
from safetensors.torch import load_file

from trace_cli.errors import UsageError
from trace_cli.stages.base import execute
from trace_cli.stages.train import prepare
from trace_cli.store import Store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory)


def _weights(art) -> dict:
    return load_file(str(art.path / "adapter" / "adapter_model.safetensors"))


def test_snapshots_are_the_shorter_runs(model_dir, tmp_path):
    set_env()
    register_parity()
    store = Store(tmp_path / "a" / "store")
    cfg = grpo_config(model_dir, max_steps=3, snapshot_steps=[2, 1], seed=7)
    final = execute("train", cfg, store).main
    snaps = final.summary["snapshots"]
    assert sorted(snaps) == ["1", "2"]
    for n in (1, 2):
        art = store.resolve(snaps[str(n)], kind="adapter")
        # the id of the config with max_steps n: a later `trace train` of that config finds it
        assert art.id == prepare(grpo_config(model_dir, max_steps=n, seed=7), store).id
        assert art.summary["steps"] == n and art.summary["snapshot_of"] == final.id
        assert pq.read_table(art.path / "train_metrics.parquet").column("step").to_pylist() == list(
            range(1, n + 1)
        )
        # the snapshot keeps the training episodes of its own steps only (8 per step)
        steps = [
            json.loads(i)["step"]
            for i in pq.read_table(art.path / "episodes.parquet").column("info").to_pylist()
        ]
        assert sorted(set(steps)) == list(range(1, n + 1)) and len(steps) == 8 * n
    # the final adapter's id does not depend on the snapshots
    assert final.id == prepare(grpo_config(model_dir, max_steps=3, seed=7), store).id
    # a 1-step run trained on its own (another store) has the snapshot's weights; the final has moved on
    alone = execute(
        "train", grpo_config(model_dir, max_steps=1, seed=7), Store(tmp_path / "b" / "store")
    ).main
    one, fin = _weights(store.resolve(snaps["1"], kind="adapter")), _weights(final)
    w_alone = _weights(alone)
    assert set(one) == set(w_alone)
    for k in one:
        assert (one[k] - w_alone[k]).abs().max().item() < 1e-5, k
    assert any((one[k] - fin[k]).abs().max().item() > 1e-6 for k in one)
    # the report draws the run's curve once (a snapshot's curve is its first steps)
    from trace_cli.report.collect import reward_curves

    assert [c["steps"] for c in reward_curves(store)] == [[1, 2, 3]]
    # re-running the same config with snapshots is a cache hit, nothing retrained
    again = execute("train", cfg, store)
    assert again.skipped


def test_snapshot_steps_are_checked(model_dir, tmp_path):
    set_env()
    register_parity()
    store = Store(tmp_path / "store")
    with pytest.raises(UsageError, match="not below max_steps"):
        prepare(grpo_config(model_dir, max_steps=3, snapshot_steps=[3]), store)
    with pytest.raises(UsageError, match="lr_scheduler linear"):
        prepare(grpo_config(model_dir, max_steps=3, snapshot_steps=[1], lr_scheduler="linear"), store)
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("manifest.yaml"))


def test_a_snapshot_step_trained_again_replaces_its_snapshot(tmp_path):
    """A run resumed from a checkpoint before a snapshot step trains that step again: the new snapshot replaces
    the old one (renaming onto a non-empty directory would fail the run)."""
    from types import SimpleNamespace

    from trace_cli.training.grpo import _snapshot_callback, snapshot_dir

    class Model:
        def __init__(self, tag):
            self.tag = tag

        def save_pretrained(self, path):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "adapter_config.json").write_text(self.tag)

    cb = _snapshot_callback([2], tmp_path, best=False)
    state = SimpleNamespace(global_step=2, is_world_process_zero=True)
    cb.on_step_end(None, state, None, model=Model("first"))
    cb.on_step_end(None, state, None, model=Model("again"))
    cb.on_step_end(None, SimpleNamespace(global_step=3, is_world_process_zero=True), None, model=Model("x"))
    assert (snapshot_dir(tmp_path, 2) / "adapter_config.json").read_text() == "again"
    assert sorted(p.name for p in snapshot_dir(tmp_path, 2).parent.iterdir()) == ["step-2"]
