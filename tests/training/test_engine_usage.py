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


SIZES = ["0.6b", "4b", "8b"]


@pytest.mark.parametrize("size", SIZES)
def test_model_size_profiles_are_valid_train_configs(size):
    """schemas/profiles/: each a GRPO config layer the train schema takes, its batch arithmetic whole groups on
    one process, and vLLM's context room for a first prompt beside the episode budget."""
    from trace_cli.config.sampling import SamplingSettings
    from trace_cli.stages.train import method_config
    from trace_cli.training import profiles

    profile = profiles.load(size)
    cfg = method_config({"method": "grpo", "env": "shop", "model": "m", **profile})
    SamplingSettings.of(cfg)  # max_new_tokens within the episode budget
    assert cfg["per_device_batch_size"] * cfg["gradient_accumulation_steps"] % cfg["num_generations"] == 0
    assert cfg["vllm"]["max_model_len"] >= cfg["max_completion_length"] + 2048
    assert cfg["rollout_batch_size"] <= cfg["per_device_batch_size"] * cfg["gradient_accumulation_steps"]


def test_there_are_profiles_for_three_model_sizes():
    from trace_cli.training import profiles

    assert list(profiles.SIZES) == SIZES
    shipped = sorted(p.name for p in (REPO / "schemas" / "profiles").iterdir())
    assert shipped == [f"grpo-qwen3-{s}.yaml" for s in SIZES]


def qwen3(layers: int, hidden: int, intermediate: int, heads: int, kv: int, vocab: int = 151936, tied=False):
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, vocab_size=vocab,
        tie_word_embeddings=tied,
    )  # fmt: skip


# Qwen3's published configs (config.json of Qwen3-0.6B, -4B, -8B) and their parameter counts (model cards)
QWEN3 = {
    "0.6b": (qwen3(28, 1024, 3072, 16, 8, tied=True), 0.6e9),
    "4b": (qwen3(36, 2560, 9728, 32, 8, tied=True), 4.0e9),
    "8b": (qwen3(36, 4096, 12288, 32, 8), 8.2e9),
}


@pytest.mark.parametrize("size", SIZES)
def test_auto_picks_the_profile_of_the_checkpoints_size(size):
    from trace_cli.training import profiles

    cfg, published = QWEN3[size]
    assert profiles.parameters(cfg) == pytest.approx(published, rel=0.1)
    assert profiles.nearest(cfg) == size
    assert profiles.kv_bytes_per_token(cfg) == 2 * cfg.num_hidden_layers * 8 * 128 * 2  # 112 KiB / 144 KiB


def test_auto_leaves_a_small_model_without_a_profile():
    from trace_cli.training import profiles

    smollm2 = qwen3(30, 576, 1536, 9, 3, vocab=49152, tied=True)  # ~135M parameters
    assert profiles.nearest(smollm2) is None


def test_rollout_batch_from_the_cards_memory():
    """vLLM's share of the card less the weights, over the planned episode's KV, in whole groups: a 4B model gets
    more episodes on 141 GB than on 80 GB, and at least one group on a small card."""
    from trace_cli.training import profiles

    cfg, _ = QWEN3["4b"]
    prof = profiles.load("4b")
    on = {gb: profiles.kv_rollout_batch(cfg, prof, gb * 2**30) for gb in (24, 80, 141)}
    assert on[24] == prof["num_generations"]  # the floor: one group
    assert on[24] <= on[80] < on[141] <= profiles.MAX_ROLLOUT_BATCH
    assert all(n % prof["num_generations"] == 0 for n in on.values())
    # 45 % of 80 GiB less 8 GB of weights, over 4,096 tokens x 144 KiB
    want = int((0.45 * 80 * 2**30 - 2 * profiles.parameters(cfg)) // (144 * 2**10 * 4096)) // 8 * 8
    assert on[80] == min(want, profiles.MAX_ROLLOUT_BATCH)


def test_profile_is_a_layer_under_the_users_keys(tiny, tmp_path, capsys):
    """`profile: 4b` on a (tiny, offline) checkpoint: the profile's keys fill the config, the user's own keys beat
    them; `auto` on a tiny model adds nothing and says so; an unknown size is refused by the schema."""
    from trace_cli.errors import UsageError
    from trace_cli.stages.train import prepare
    from trace_cli.store import Store

    store = Store(tmp_path / "store")
    own = {"method": "grpo", "env": TEST_ENV, "model": str(tiny.hf), "seeds": "100:300", "max_turns": 2,
           "max_new_tokens": 12, "max_completion_length": 96, "per_device_batch_size": 8}  # fmt: skip
    cfg = prepare({**own, "profile": "4b"}, store).config
    assert "train: profile 4b" in capsys.readouterr().err
    assert cfg["lora"]["r"] == 16 and cfg["vllm"]["gpu_memory_utilization"] == 0.45  # the profile's
    assert cfg["gradient_accumulation_steps"] == 16 and cfg["rollout_batch_size"] == 32
    assert cfg["per_device_batch_size"] == 8 and cfg["max_completion_length"] == 96  # the user's
    plain = prepare(own, store)
    auto = prepare({**own, "profile": "auto"}, store)
    assert "under 0.3B: no profile" in capsys.readouterr().err
    assert {k: v for k, v in auto.config.items() if k != "profile"} == {
        k: v for k, v in plain.config.items() if k != "profile"
    }
    assert auto.id == plain.id  # the profile's name is not in the id: its values are
    with pytest.raises(UsageError, match="profile"):
        prepare({**own, "profile": "70b"}, store)
