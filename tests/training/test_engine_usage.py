"""The `rollout` block's usage errors: exit 2 before any compute, nothing written (train, eval, synthesize)."""

from __future__ import annotations

import pytest
import tinymodel  # noqa: E402
from grpo_helpers import TEST_ENV, register_parity, set_env  # noqa: E402
from serving import free_port  # noqa: E402
from trace_testing import REPO, run_cli, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    set_env()
    register_parity()
    return tinymodel.tiny(tmp_path_factory)


def _train(tiny, store, *sets: str):
    args = ["train", "--method", "grpo", "--env", TEST_ENV, "--model", str(tiny.hf), "--store", str(store)]
    for s in sets:
        args += ["--set", s]
    return run_cli(*args)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["rollout.engine=server"], "rollout.engine server needs rollout.url"),
        (["rollout.url=http://127.0.0.1:9/v1"], "rollout.url is for rollout.engine server"),
        (["rollout.engine=server", "rollout.url=http://127.0.0.1:{port}/v1"], "no vLLM-compatible server"),
        (["use_vllm=true", "rollout.engine=server", "rollout.url=http://x:1/v1"], "drop use_vllm"),
        (["rollout.engine=warp"], "rollout.engine"),
    ],
)
def test_train_refuses_a_bad_rollout_block_before_compute(tiny, tmp_path, sets, message):
    store = tmp_path / "store"
    before = snapshot(store)
    res = _train(tiny, store, *(s.format(port=free_port()) for s in sets))
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert snapshot(store) == before


def test_eval_refuses_a_server_that_does_not_answer(tiny, tmp_path):
    store = tmp_path / "store"
    url = f"http://127.0.0.1:{free_port()}/v1"
    res = run_cli(
        "eval", "--model", str(tiny.hf), "--env", "shop", "--seeds", "0:2", "--store", str(store),
        "--set", "rollout.engine=server", "--set", f"rollout.url={url}",
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "no vLLM-compatible server answers" in res.output
    assert not list(store.glob("*/*/manifest.yaml"))


def test_eval_of_a_policy_on_another_engine_is_refused(tiny, tmp_path):
    res = run_cli(
        "eval", "--model", "policy:random", "--env", "shop", "--seeds", "0:2", "--store", str(tmp_path / "s"),
        "--set", "rollout.engine=vllm",
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "only a model or an adapter runs on another engine" in res.output


PROFILES = sorted((REPO / "examples" / "profiles").glob("grpo-*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_model_size_profiles_are_valid_train_configs(path):
    """examples/profiles/: each a GRPO --config layer the train schema takes, its batch arithmetic whole groups
    on one process, and vLLM's context room for a first prompt beside the episode budget."""
    import yaml

    from trace_cli.config.sampling import SamplingSettings
    from trace_cli.stages.train import method_config

    profile = yaml.safe_load(path.read_text())
    cfg = method_config({"method": "grpo", "env": "shop", "model": "m", **profile})
    SamplingSettings.of(cfg)  # max_new_tokens within the episode budget
    assert cfg["per_device_batch_size"] * cfg["gradient_accumulation_steps"] % cfg["num_generations"] == 0
    assert cfg["vllm"]["max_model_len"] >= cfg["max_completion_length"] + 2048
    assert cfg["rollout_batch_size"] <= cfg["per_device_batch_size"] * cfg["gradient_accumulation_steps"]


def test_there_are_profiles_for_three_model_sizes():
    assert [p.stem for p in PROFILES] == ["grpo-qwen3-0.6b", "grpo-qwen3-4b", "grpo-qwen3-8b"]
