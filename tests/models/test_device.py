"""`$TRACE_DEVICE`: one device choice (auto | cpu | cuda | cuda:N), a GPU asked for but absent is exit 2 with
nothing written (never a silent CPU fallback), and cpu runs the real stages."""

from __future__ import annotations

import json

import pytest
import tinymodel
import torch
from trace_testing import run_cli

from trace_cli.errors import UsageError
from trace_cli.models import device

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


def test_cpu_and_auto_resolve_to_the_cpu_here(monkeypatch):
    monkeypatch.setenv(device.ENV, "cpu")
    assert device.resolve() == torch.device("cpu") and device.dtype() == torch.float32
    assert not device.is_cuda()
    monkeypatch.delenv(device.ENV)
    assert device.requested() == "auto"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.resolve().type == expected
    assert device.resolve(" CPU ") == torch.device("cpu")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "mps", "cpu:0"])
def test_unknown_device_names_are_usage_errors(bad):
    with pytest.raises(UsageError, match="expected auto, cpu, cuda or cuda:N"):
        device.resolve(bad)


@NO_GPU
@pytest.mark.parametrize("req", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_asked_for_but_absent_is_a_usage_error(req, monkeypatch):
    with pytest.raises(UsageError, match="no CUDA GPU is visible") as e:
        device.resolve(req)
    assert f"{device.ENV}=cpu" in str(e.value)
    monkeypatch.setenv(device.ENV, req)
    with pytest.raises(UsageError):
        device.check()
    with pytest.raises(UsageError):
        device.is_cuda()


EVAL = ["eval", "--env", "shop", "--seeds", "0:1", "--max-new-tokens", "4", "--max-turns", "1"]


@NO_GPU
@pytest.mark.parametrize(
    "args", [EVAL, ["train", "--method", "sft", "--env", "shop", "--seeds", "0:2"]], ids=["eval", "train"]
)
def test_cli_exits_2_and_writes_nothing_when_cuda_is_asked_for(tiny_model, tmp_path, args):
    root = tmp_path / "store"
    r = run_cli(*args, "--model", str(tiny_model.hf), "--store", root, env={device.ENV: "cuda"})
    assert r.exit_code == 2, r.output
    assert "TRACE_DEVICE=cuda: no CUDA GPU is visible" in r.stderr
    assert "Traceback" not in r.output
    assert not root.exists()


def test_cpu_runs_eval_on_the_tiny_model(tiny_model, tmp_path):
    root = tmp_path / "store"
    r = run_cli(*EVAL, "--model", str(tiny_model.hf), "--store", root, "--json", env={device.ENV: "cpu"})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"]["episodes"] == 1


def test_load_hf_places_the_model_on_the_chosen_device(tiny_model, monkeypatch):
    from trace_cli.models.refs import load_hf, resolve_model

    monkeypatch.setenv(device.ENV, "cpu")
    model, _ = load_hf(resolve_model(str(tiny_model.hf), None))
    p = next(model.parameters())
    assert p.device == torch.device("cpu") and p.dtype == torch.float32


def test_eval_policies_share_a_prefix_cache_sized_for_the_device(tiny_model, monkeypatch):
    """load_policy (eval's policy) prefills the prompt that episodes share once: the second episode's first
    turn starts from what the first one left in the prefix cache."""
    from trace_cli.compose.policy import load_policy
    from trace_cli.envs import make_env
    from trace_cli.envs.rollout import rollout
    from trace_cli.models.refs import resolve_model

    monkeypatch.setenv(device.ENV, "cpu")
    policy = load_policy(resolve_model(str(tiny_model.hf), None), temperature=0.0, max_new_tokens=4)
    assert policy.prefix_cache is not None and policy.prefix_cache.hit_tokens == 0
    assert policy.prefix_cache.max_bytes == device.PREFIX_CACHE_MIB["cpu"] << 20
    rollout(policy, lambda: make_env("shop"), [(0, 0), (1, 0)], max_turns=1, batch_size=1)
    assert policy.prefix_cache.hit_tokens > 0


def test_no_prefix_cache_for_a_model_with_sliding_window_layers():
    """A sliding-window layer keeps only its window: its keys/values cannot be reused by prefix (eval,
    calibration and GRPO decide as serve does)."""
    from types import SimpleNamespace

    sliding = SimpleNamespace(config=SimpleNamespace(layer_types=["sliding_attention", "full_attention"]))
    full = SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention"]))
    assert device.prefix_cache(sliding, torch.device("cpu")) is None
    assert device.prefix_cache(full, torch.device("cpu")) is not None


def test_the_prefix_cache_is_sized_or_turned_off_by_its_variable(tiny_model, monkeypatch):
    from trace_cli.compose.policy import load_policy
    from trace_cli.models.refs import resolve_model

    ref = resolve_model(str(tiny_model.hf), None)
    monkeypatch.setenv(device.ENV, "cpu")
    monkeypatch.setenv(device.PREFIX_CACHE_ENV, "0")
    assert load_policy(ref, temperature=0.0, max_new_tokens=4).prefix_cache is None
    monkeypatch.setenv(device.PREFIX_CACHE_ENV, " 1.5 ")
    assert load_policy(ref, temperature=0.0, max_new_tokens=4).prefix_cache.max_bytes == 3 << 19


@pytest.mark.parametrize("bad", ["-1", "off", "nan", "inf"])
def test_a_bad_prefix_cache_size_exits_2_and_writes_nothing(tiny_model, tmp_path, bad):
    root = tmp_path / "store"
    r = run_cli(*EVAL, "--model", str(tiny_model.hf), "--store", root, env={device.PREFIX_CACHE_ENV: bad})
    assert r.exit_code == 2, r.output
    assert f"{device.PREFIX_CACHE_ENV}={bad!r}: expected a size in MiB >= 0" in r.stderr
    assert not root.exists()
