"""`trace train --method sft`: a base agent fine-tuned on reference demonstrations, with named deficits withheld."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tinymodel  # noqa: E402
from trace_testing import run_cli, snapshot  # noqa: E402

from trace_cli.envs.shop import CAPABILITIES, family_capabilities  # noqa: E402
from trace_cli.errors import UsageError  # noqa: E402
from trace_cli.store import Store  # noqa: E402
from trace_cli.training.sft import demonstrations  # noqa: E402

SEEDS = "100000:100016"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


def _train(root: Path, model: Path, *extra: str) -> dict:
    r = run_cli(
        "train",
        "--method",
        "sft",
        "--env",
        "shop",
        "--model",
        str(model),
        "--seeds",
        SEEDS,
        "--set",
        "epochs=1",
        "--set",
        "batch_size=4",
        *extra,
        "--store",
        root,
        "--json",
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _state(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _check_trained(root: Path, doc: dict, base: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    art = Store(root).resolve(doc["uri"])
    assert art.kind == "model"
    hf = art.path / "hf"
    # a plain HF model + tokenizer: loadable as such, same architecture and parameter names as the base
    model = AutoModelForCausalLM.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    assert type(model).__name__ == "Qwen3ForCausalLM" and len(tok) == model.config.vocab_size
    assert not (hf / "adapter_config.json").exists()
    new, old = _state(hf), _state(base)
    assert new.keys() == old.keys()
    assert not any("lora" in k for k in new)
    changed = [k for k in old if not torch.equal(new[k], old[k])]
    assert changed, "training did not change any weight"
    # per-step metrics
    import pyarrow.parquet as pq

    metrics = pq.read_table(art.path / "train_metrics.parquet").to_pylist()
    s = art.summary
    assert s["method"] == "sft" and s["steps"] == len(metrics) >= 1
    assert s["demonstrations"] >= 1
    assert [m["step"] for m in metrics] == list(range(len(metrics)))
    assert all(math.isfinite(m["loss"]) and m["loss"] > 0 and m["tokens"] > 0 for m in metrics)
    return art, changed


def test_sft_full_fine_tune(tiny_model, tmp_path):
    root = tmp_path / "store"
    doc = _train(root, tiny_model.hf)
    art, changed = _check_trained(root, doc, tiny_model.hf)
    assert len(changed) > 10  # full fine-tune: (nearly) every tensor moves
    assert not (art.config.get("lora") or {}).get("enabled", False)
    assert art.config["epochs"] == 1 and art.config["batch_size"] == 4
    # the same run again is up to date
    before = snapshot(root)
    again = _train(root, tiny_model.hf)
    assert again["skipped"] is True and again["id"] == doc["id"]
    assert [p for p, *_ in snapshot(root)] == [p for p, *_ in before]


def test_sft_lora_trains_and_merges(tiny_model, tmp_path):
    root = tmp_path / "store"
    doc = _train(
        root, tiny_model.hf, "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "learning_rate=0.01"
    )
    art, changed = _check_trained(root, doc, tiny_model.hf)
    assert art.config["lora"]["enabled"] is True
    # LoRA touches the linear layers only: embeddings and norms are the base's
    assert not any("norm" in k or "embed" in k for k in changed), changed
    assert any("proj" in k for k in changed)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--deficit", "not_a_capability"], "unknown deficit 'not_a_capability'"),
        (["--set", "nope=1"], "nope"),
        (["--env", "shop?n_orders=abc"], "n_orders"),
    ],
)
def test_sft_bad_input_exit_2_nothing_written(tiny_model, tmp_path, extra, message):
    root = tmp_path / "store"
    root.mkdir()
    args = ["--method", "sft", "--env", "shop", "--model", str(tiny_model.hf), "--seeds", SEEDS]
    r = run_cli("train", *args, *extra, "--store", root)
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert snapshot(root) == []


# ------------------------------------------------------------------------------------------ demonstrations
DEMO_SEEDS = list(range(100000, 100024))  # four tasks of each family


def _affected(demo: dict, deficits: set[str]) -> bool:
    return bool(set(family_capabilities()[demo["family"]]) & deficits)


@pytest.fixture(scope="module")
def reference_demos():
    demos = demonstrations("shop", DEMO_SEEDS, set(), deficit_rate=0.0, seed=0)
    assert all(d["reward"] == 1.0 for d in demos)
    return demos


@pytest.mark.parametrize(
    "deficits", [{c} for c in CAPABILITIES] + [{"precondition_verification", "multi_step_completion"}]
)
def test_deficit_rate_one_withholds_exactly_the_required_behaviour(reference_demos, deficits):
    withheld = demonstrations("shop", DEMO_SEEDS, deficits, deficit_rate=1.0, seed=0)
    n_affected = 0
    for ref, d in zip(reference_demos, withheld, strict=True):
        assert d["seed"] == ref["seed"] and d["family"] == ref["family"]
        if _affected(d, deficits):
            n_affected += 1
            assert d["messages"] != ref["messages"]
            assert d["reward"] == 0.0  # fails by construction
        else:
            assert d["messages"] == ref["messages"] and d["reward"] == 1.0
    assert n_affected >= 4


def test_deficit_rate_zero_is_the_reference(reference_demos):
    caps = set(CAPABILITIES)
    shown = demonstrations("shop", DEMO_SEEDS, caps, deficit_rate=0.0, seed=0)
    assert [d["messages"] for d in shown] == [d["messages"] for d in reference_demos]


def test_deficit_rate_between_mixes_deterministically(reference_demos):
    caps = set(CAPABILITIES)
    a = demonstrations("shop", DEMO_SEEDS, caps, deficit_rate=0.5, seed=3)
    b = demonstrations("shop", DEMO_SEEDS, caps, deficit_rate=0.5, seed=3)
    full = demonstrations("shop", DEMO_SEEDS, caps, deficit_rate=1.0, seed=0)
    assert [d["messages"] for d in a] == [d["messages"] for d in b]
    kinds = []
    for ref, d, w in zip(reference_demos, a, full, strict=True):
        assert d["messages"] in (ref["messages"], w["messages"])  # either shown or withheld, nothing else
        if _affected(d, caps):
            kinds.append(d["messages"] == w["messages"])
    assert any(kinds) and not all(kinds), kinds


def test_unknown_deficit_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown deficit"):
        demonstrations("shop", DEMO_SEEDS[:2], {"not_a_capability"}, deficit_rate=1.0, seed=0)


@pytest.mark.slow
def test_accelerate_two_processes_train_what_one_does(tiny_model, tmp_path):
    """`accelerate launch --num_processes 2` on CPU (gloo): each process trains on its half of every batch, the
    gradients are summed, and rank 0 alone writes; the weights are those of one process on the same batches (the
    same arithmetic summed in another order: compared with a tolerance), and the loss curve is the same."""
    import os
    import subprocess

    import pyarrow.parquet as pq
    import torch
    from trace_testing import BIN, REPO

    def cli(*launch: str, store: Path) -> dict:
        args = ["train", "--method", "sft", "--env", "shop", "--model", str(tiny_model.hf), "--seeds", SEEDS,
                "--set", "epochs=1", "--set", "batch_size=4", "--set", "learning_rate=0.01",
                "--store", str(store), "--json"]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
        env.pop("TRACE_STORE", None)
        r = subprocess.run([*launch, str(BIN / "trace"), *args], env=env, capture_output=True, text=True,
                           timeout=600, cwd=REPO)  # fmt: skip
        assert r.returncode == 0, r.stderr[-4000:]
        return json.loads(r.stdout)  # exactly one JSON document: rank 1 prints nothing

    port = str(29500 + os.getpid() % 500)
    two = cli(str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port,
              store=tmp_path / "two")  # fmt: skip
    one = cli(store=tmp_path / "one")
    assert two["summary"]["world_size"] == 2 and one["summary"]["world_size"] == 1
    assert two["id"] == one["id"]  # the same training: the same artifact
    assert [a.id for a in Store(tmp_path / "two").list("model")] == [two["id"]]
    assert not list((tmp_path / "two" / ".tmp").glob("*")), "no temp dirs are left behind"
    got = _state(Store(tmp_path / "two").resolve(two["uri"]).path / "hf")
    want = _state(Store(tmp_path / "one").resolve(one["uri"]).path / "hf")
    base = _state(tiny_model.hf)
    moved = max(float((want[k] - base[k]).abs().max()) for k in want)
    assert moved > 1e-3  # it trained
    for k in want:  # the same updates: differences are float rounding, far below what training moved
        assert torch.allclose(got[k], want[k], atol=1e-4, rtol=1e-3), k
    loss = [pq.read_table(Store(tmp_path / d).resolve(x["uri"]).path / "train_metrics.parquet").column("loss")
            .to_pylist() for d, x in (("two", two), ("one", one))]  # fmt: skip
    assert len(loss[0]) == len(loss[1]) >= 3
    assert all(math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-4) for a, b in zip(*loss, strict=True))
