"""`trace model pretrain`: the copy curriculum, its probe, the artifact, and bad inputs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tinymodel  # noqa: E402
from trace_testing import run_cli, snapshot  # noqa: E402

from trace_cli.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


def test_copy_rows_label_only_the_repeated_key(tiny_model):
    from transformers import AutoTokenizer

    from trace_cli.training.pretrain import SEPARATORS, copy_row, copy_vocabulary

    tok = AutoTokenizer.from_pretrained(tiny_model.hf)
    vocab = copy_vocabulary(tok, ['{"email": "ana.li123@example.com", "order_id": "#W1234567"}'])
    assert len(vocab) >= 10  # every digit at least
    assert not set(vocab) & set(tok.all_special_ids)
    seps = [tok(s, add_special_tokens=False)["input_ids"] for s in SEPARATORS]
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    ids, labels = copy_row(random.Random(0), vocab, seps, nl, 64)
    assert len(ids) == len(labels) <= 64
    labelled = [t for t in labels if t != -100]
    assert labelled and all(t in vocab for t in labelled)
    # every labelled span equals the span right before its separator (the key it repeats)
    i = 0
    while i < len(labels):
        if labels[i] == -100:
            i += 1
            continue
        j = i
        while j < len(labels) and labels[j] != -100:
            j += 1
        key = ids[i:j]
        assert any(ids[i - len(sep) - len(key) : i - len(sep)] == key for sep in seps), (i, j)
        i = j


def test_pretrain_writes_a_model_with_its_probe(tiny_model, tmp_path):
    store = tmp_path / "store"
    args = ["model", "pretrain", "--model", str(tiny_model.hf), "--name", "copy", "--json", "--store", store]
    sets = [
        "--set",
        "max_steps=30",
        "--set",
        "probe_every=15",
        "--set",
        "probe_size=10",
        "--set",
        "corpus_seeds=10",
    ]
    r = run_cli(*args, *sets, "--set", "require_target=false")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    s = out["summary"]
    assert s["steps"] == 30 and [p["step"] for p in s["probes"]] == [15, 30]
    assert 0.0 <= s["copy_accuracy"] <= 1.0
    rows = json.loads(
        run_cli(
            "store",
            "sql",
            "select step, loss from pretrain_metrics order by step",
            "--json",
            "--store",
            store,
        ).stdout
    )
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert sum(r["loss"] for r in rows[-5:]) < sum(r["loss"] for r in rows[:5])  # it trains
    art = Store(store).resolve("store://model/copy")
    assert (art.path / "hf" / "model.safetensors").is_file()
    # the pretrained model is a model reference like any other
    r = run_cli("model", "show", "store://model/copy", "--json", "--store", store)
    assert r.exit_code == 0 and json.loads(r.stdout)["kind"] == "hf"


def test_pretrain_that_misses_its_target_writes_nothing(tiny_model, tmp_path):
    store = tmp_path / "store"
    r = run_cli(
        "model", "pretrain", "--model", str(tiny_model.hf), "--store", store,
        "--set", "max_steps=5", "--set", "probe_every=5", "--set", "probe_size=10", "--set", "corpus_seeds=5",
    )  # fmt: skip
    assert r.exit_code == 1 and "copy probe reached" in r.stderr
    assert not (store / "model").exists() or not any((store / "model").iterdir())


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["--set", "max_steps=0"], "max_steps"),
        (["--set", "transcript_share=1.5"], "transcript_share"),
        (["--set", "bogus=1"], "bogus"),
        (["--set", "envs=[nowhere]"], "nowhere"),
    ],
)
def test_bad_config_exit_2_nothing_written(tiny_model, tmp_path, sets, needle):
    store = tmp_path / "store"
    store.mkdir()
    before = snapshot(store)
    r = run_cli("model", "pretrain", "--model", str(tiny_model.hf), "--store", store, *sets)
    assert r.exit_code == 2 and needle in r.output
    assert snapshot(store) == before


@pytest.mark.slow
def test_small_preset_learns_to_copy(tmp_path):
    """The acceptance of the copy phase: the small preset reaches the 0.95 probe (measured: step 300)."""
    store = tmp_path / "store"
    assert (
        run_cli(
            "run", str(Path(__file__).resolve().parents[2] / "recipes" / "pretrain.yaml"), "--store", store
        ).exit_code
        == 0
    )
    art = Store(store).resolve("store://model/demo-small-copy")
    assert art.summary["copy_accuracy"] >= 0.95


def test_time_budget_stops_with_a_final_probe(tiny_model, tmp_path):
    store = tmp_path / "store"
    r = run_cli(
        "model", "pretrain", "--model", str(tiny_model.hf), "--json", "--store", store,
        "--set", "max_minutes=0.0001", "--set", "require_target=false", "--set", "probe_size=10",
        "--set", "corpus_seeds=5",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["summary"]
    assert s["steps"] == 1 and s["probes"] == [{"step": 1, "copy_accuracy": s["copy_accuracy"]}]
