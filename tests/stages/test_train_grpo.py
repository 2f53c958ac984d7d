"""`trace train --method grpo`: adapter artifact, metrics view, evaluation of base + adapter, validation
before compute, kill-and-resume, and data-parallel training under `accelerate launch` (2 CPU processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from grpo_helpers import CAPABILITY, ENV_VARS, TEST_ENV, grpo_config, register_parity, set_env, tiny_model  # noqa: E402
from trace_testing import BIN, REPO, make_diagnosis, run_cli, short_eval, snapshot  # noqa: E402

from trace_cli.stages.base import execute  # noqa: E402
from trace_cli.store import Store  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(model_dir, tmp_path_factory):
    """One GRPO run on the parity env (rewards vary within groups, so the LoRA moves)."""
    set_env()
    register_parity()
    store = Store(tmp_path_factory.mktemp("grpo-stage") / "store")
    out = execute("train", grpo_config(model_dir), store, name="parity")
    return store, out


def _train_args(model_dir, store, *extra, env="shop"):
    return [
        "train",
        "--method",
        "grpo",
        "--env",
        env,
        "--model",
        str(model_dir),
        "--store",
        str(store),
        "--seeds",
        "100:140",
        "--set",
        "num_generations=4",
        "--set",
        "per_device_batch_size=8",
        "--set",
        "gradient_accumulation_steps=1",
        "--set",
        "max_turns=2",
        "--set",
        "max_new_tokens=12",
        "--set",
        "max_completion_length=96",
        "--set",
        "lora.r=4",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------- artifact
def test_adapter_artifact(trained, model_dir):
    store, out = trained
    assert not out.skipped and set(out.outputs) == {"adapter"}
    art = out.main
    assert art.kind == "adapter" and art.uri == f"store://adapter/{art.id}"
    files = {f["path"] for f in art.manifest["files"]}
    assert files == {
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
        # the adapter carries the tokenizer and the chat template it was trained with (issue 12)
        "adapter/tokenizer.json",
        "adapter/tokenizer_config.json",
        "adapter/chat_template.jinja",
        "train_metrics.parquet",
        "train_config.json",
        # its own training episodes, in the rollouts format (issue 30: the MoE gates learn from them)
        "episodes.parquet",
        "tool_calls.parquet",
    }
    s = art.summary
    assert s["method"] == "grpo" and s["capability"] == CAPABILITY  # from env.task_metadata()
    assert s["base_model"] == str(model_dir) and s["base_model_path"] == str(model_dir.resolve())
    assert s["steps"] == 2 and s["episodes_per_step"] == 8 and s["rollouts"] == 16
    assert s["world_size"] == 1 and s["trainable_parameters"] < s["parameters"]
    assert art.config["learning_rate"] == 0.05 and art.config["lora"] == {
        "r": 4,
        "alpha": 8,
        "dropout": 0.0,
        "target_modules": "all-linear",
    }
    assert "resume" not in art.config and "deficits" not in art.config and "epochs" not in art.config
    resolved = json.loads((art.path / "train_config.json").read_text())
    assert resolved["episodes_per_step"] == 8 and resolved["seeds_per_step"] == 2
    assert not list(store.tmp_root.glob("*")), "work and temp dirs are removed after a successful run"


def test_adapter_keeps_its_training_episodes(trained):
    """Every episode the run trained on, with its step, group (seed) and advantage against the group mean."""
    from trace_cli.store.rollouts import read_episodes

    art = trained[1].main
    eps = read_episodes(art.path)
    assert len(eps) == 16 == art.summary["training_episodes"]  # 2 steps x 8 episodes, under the default bound
    assert sorted({ep["info"]["step"] for ep in eps}) == [1, 2]
    groups: dict[tuple[int, int], list[dict]] = {}
    for ep in eps:
        groups.setdefault((ep["info"]["step"], ep["seed"]), []).append(ep)
    assert len(groups) == 4 and all(len(g) == 4 for g in groups.values())  # num_generations 4
    for g in groups.values():
        mean = sum(ep["reward"] for ep in g) / len(g)
        for ep in g:
            assert ep["info"]["group_mean"] == pytest.approx(mean)
            assert ep["info"]["advantage"] == pytest.approx(ep["reward"] - mean)
        assert sorted(ep["trial"] for ep in g) == [0, 1, 2, 3]
    assert any(ep["info"]["advantage"] > 0 for ep in eps)  # parity rewards vary within groups
    assert all(ep["messages"][0]["role"] == "system" and ep["tools"] is not None for ep in eps)
    assert all(any(m["role"] == "assistant" for m in ep["messages"]) for ep in eps)


def test_metrics_table_and_view(trained):
    from trace_cli.store.sql import query

    store, out = trained
    rows = pq.read_table(out.main.path / "train_metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward"] is not None and r["learning_rate"] == 0.05 for r in rows)
    cols, got = query(store, "SELECT step, reward, rollouts, artifact_id FROM train_metrics ORDER BY step")
    assert [g[0] for g in got] == [1, 2] and got[-1][2] == 16 and got[0][3] == out.main.id


def test_adapter_loads_with_peft_and_changes_outputs(trained, model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, out = trained
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    x = torch.tensor([[1, 5, 9, 13, 20]])
    before = base(x).logits.detach().clone()
    model = PeftModel.from_pretrained(base, out.main.path / "adapter")
    after = model(x).logits.detach()
    assert not torch.allclose(before, after), "the trained adapter has no effect"
    with model.disable_adapter():
        assert torch.allclose(model(x).logits, before)


def test_rerun_is_up_to_date(trained, model_dir):
    store, out = trained
    again = execute(
        "train", grpo_config(model_dir, checkpoint_every=3), store
    )  # checkpointing is not identity
    assert again.skipped and again.main.id == out.main.id


def test_eval_base_plus_adapter(trained):
    store, out = trained
    r = short_eval("store://adapter/parity", store.root, "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["summary"]["episodes"] == 2
    ev = Store(store.root).resolve(res["eval"])
    assert {"role": "model", "digest": out.main.digest, "id": out.main.id, "kind": "adapter"} in ev.manifest[
        "inputs"
    ]


def test_adapter_base_resolution_checks_digest(trained, model_dir, tmp_path):
    """The adapter's base is found by the recorded digest; a changed base is refused, not silently used."""
    import shutil

    from trace_cli.errors import NotFoundError
    from trace_cli.models.refs import resolve_model

    store, out = trained
    ref = resolve_model("store://adapter/parity", store)
    assert ref.kind == "adapter" and ref.path == model_dir.resolve()
    assert ref.adapter_path == out.main.path / "adapter"
    moved = tmp_path / "copy"
    shutil.copytree(store.root, moved)
    m = yaml.safe_load((moved / "adapter" / out.main.id / "manifest.yaml").read_text())
    m["inputs"][0]["digest"] = "0" * 64
    (moved / "adapter" / out.main.id / "manifest.yaml").write_text(yaml.safe_dump(m))
    with pytest.raises(NotFoundError, match="base model is gone or changed"):
        resolve_model("store://adapter/parity", Store(moved))


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "per_device_batch_size=6"], "not a multiple of num_generations (4)"),
        (["--set", "num_generations=1"], "num_generations: 1 is less than the minimum of 2"),
        (["--set", "max_completion_length=4090"], "more than the model's context (4096)"),
        (["--set", "max_new_tokens=200"], "exceeds max_completion_length"),
        (["--seeds", "100:101"], "each step needs 2 different seeds"),
        (["--deficit", "precondition_verification"], "deficits: only used by method sft (method is grpo)"),
        (["--set", "use_vllm=true"], "use_vllm"),
        (["--set", "lora.enabled=false"], "grpo always trains a LoRA adapter"),
        (["--set", "bogus=1"], "bogus: unknown key"),
    ],
)
def test_validation_before_compute(model_dir, tmp_path, extra, message):
    store = tmp_path / "store"
    r = run_cli(*_train_args(model_dir, store, *extra))
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert snapshot(store) == [], "nothing may be written before validation passes"


def test_bad_references_exit_2(model_dir, tmp_path, trained):
    store = tmp_path / "store"

    def grpo(env, model, root):
        return run_cli("train", "--method", "grpo", "--env", env, "--model", str(model), "--store", str(root))

    r = grpo("nowhere", model_dir, store)
    assert r.exit_code == 2 and "unknown environment 'nowhere'" in r.output
    r = grpo("shop", tmp_path / "missing", store)
    assert r.exit_code == 2 and "not found" in r.output
    r = grpo("shop", "store://adapter/parity", trained[0].root)
    assert r.exit_code == 2 and "not on a adapter" in r.output.replace("an adapter", "a adapter")
    assert snapshot(store) == []


def test_sft_config_is_unchanged_by_grpo_keys():
    from trace_cli.stages.train import GRPO_ONLY, _method_config

    cfg = _method_config({"method": "sft", "env": "shop", "model": "x"})
    assert cfg["learning_rate"] == 0.002
    assert not set(GRPO_ONLY) & set(cfg)
    assert set(cfg) == {
        "method",
        "env",
        "model",
        "seeds",
        "seed",
        "deficits",
        "deficit_rate",
        "epochs",
        "learning_rate",
        "batch_size",
        "max_minutes",
        "max_length",
        "loss_on",
        "gradient_checkpointing",  # both methods: null = on on a GPU
    }
    r = run_cli("train", "--method", "sft", "--env", "shop", "--model", "x", "--set", "num_generations=4")
    assert r.exit_code == 2 and "num_generations: only used by method grpo (method is sft)" in r.output


def test_recipe_can_reference_the_adapter(tmp_path):
    from trace_cli.recipes.model import load_recipe

    doc = {
        "kind": "recipe",
        "version": 1,
        "name": "t",
        "steps": [
            {"id": "m", "uses": "model", "with": {"preset": "tiny"}},
            {
                "id": "t",
                "uses": "train",
                "with": {"method": "grpo", "env": "shop", "model": "${steps.m.outputs.model}"},
            },
            {"id": "e", "uses": "eval", "with": {"env": "shop", "model": "${steps.t.outputs.adapter}"}},
        ],
    }
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert [s.id for s in load_recipe(p).steps] == ["m", "t", "e"]


# ---------------------------------------------------------------------------------------------- fan-out
OTHER_ENV, OTHER_CAPABILITY = "grpo-parity-other", "other_talk"


def _register_other() -> None:
    from grpo_helpers import ParityEnv

    from trace_cli.envs.registry import register

    class OtherParity(ParityEnv):
        def task_metadata(self):
            return {**super().task_metadata(), "capability": OTHER_CAPABILITY}

    register_parity()
    register(OTHER_ENV, lambda **kw: OtherParity(**kw), overwrite=True)


def test_a_list_of_environments_fans_out_by_their_capabilities(model_dir, tmp_path):
    from trace_cli.errors import UsageError, ValidationError
    from trace_cli.stages.base import fan_out

    _register_other()
    st = Store(tmp_path / "store")
    cfg = grpo_config(model_dir, env=[TEST_ENV, OTHER_ENV])
    assert [(k, c["env"]) for k, c in fan_out("train", cfg, st)] == [
        (CAPABILITY, TEST_ENV),
        (OTHER_CAPABILITY, OTHER_ENV),
    ]
    assert all(c == {**cfg, "env": c["env"]} for _, c in fan_out("train", cfg, st))
    assert fan_out("train", grpo_config(model_dir), st) == [(None, grpo_config(model_dir))]
    with pytest.raises(UsageError, match="more than one artifact would be for 'parity_talk'"):
        fan_out("train", grpo_config(model_dir, env=[TEST_ENV, TEST_ENV]), st)
    with pytest.raises(UsageError, match="capability: each adapter is for its own environment"):
        fan_out("train", {**cfg, "capability": "x"}, st)
    with pytest.raises(ValidationError, match="env: .* is not of type 'string'"):  # sft: one environment
        fan_out("train", {"method": "sft", "env": [TEST_ENV], "model": str(model_dir)}, st)
    assert snapshot(st.root) == []


def test_train_command_makes_one_adapter_per_environment(model_dir, tmp_path):
    set_env()
    _register_other()
    store = tmp_path / "store"
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(grpo_config(model_dir, env=[TEST_ENV, OTHER_ENV], max_steps=1)))
    r = run_cli("train", "--config", cfg, "--name", "p", "--json", "--store", store)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [(a["capability"], a["name"], a["skipped"]) for a in out["adapters"]] == [
        (CAPABILITY, f"p-{CAPABILITY}", False),
        (OTHER_CAPABILITY, f"p-{OTHER_CAPABILITY}", False),
    ]
    assert out["failures"] == []
    st = Store(store)
    for a in out["adapters"]:
        art = st.resolve(f"adapter/{a['name']}")
        assert (
            art.uri == a["uri"] and art.summary["capability"] == a["capability"] and art.summary["steps"] == 1
        )
    r = run_cli("train", "--config", cfg, "--name", "p", "--store", store)  # text: a row each, up to date
    assert r.exit_code == 0 and r.stderr.count("up to date") == 2
    assert all(a["uri"] in r.stdout for a in out["adapters"]) and OTHER_CAPABILITY in r.stdout


# ---------------------------------------------------------------------------------------------- slow
_SITE: list[str] = []


def _env() -> dict[str, str]:
    """The environment of a real `trace` subprocess (also under `accelerate launch`): a sitecustomize on
    PYTHONPATH registers the parity environment in every process, since the tiny model earns a constant reward
    on shop and a GRPO run that learns nothing exits 1."""
    import tempfile

    if not _SITE:
        d = Path(tempfile.mkdtemp(prefix="trace-grpo-site-"))
        helpers = Path(__file__).resolve().parents[1] / "training"
        (d / "sitecustomize.py").write_text(
            f"import sys\nsys.path.insert(0, {str(helpers)!r})\n"
            "from grpo_helpers import register_parity\nregister_parity()\n"
        )
        _SITE.append(str(d))
    e = dict(os.environ)
    e.update(ENV_VARS)
    e.pop("TRACE_STORE", None)
    e["PYTHONPATH"] = os.pathsep.join([_SITE[0], *filter(None, [e.get("PYTHONPATH")])])
    return e


def _trace() -> list[str]:
    exe = BIN / "trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]


@pytest.mark.slow
def test_kill_and_resume(model_dir, tmp_path):
    """SIGKILL a real `trace train` after its first checkpoint: no artifact is visible; `--resume` continues from
    the checkpoint and ends with the uninterrupted number of optimizer steps."""
    store = tmp_path / "store"
    steps = 4
    args = _train_args(
        model_dir, store, "--max-steps", str(steps), "--set", "checkpoint_every=1", "--json", env=TEST_ENV
    )
    proc = subprocess.Popen(
        _trace() + args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    ckpt = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = sorted(store.glob(".tmp/train-*/checkpoints/checkpoint-*/trainer_state.json"))
        if found:
            ckpt = found[0]
            break
        time.sleep(0.2)
    assert ckpt is not None, (
        f"no checkpoint appeared: {proc.communicate()[1][-3000:] if proc.poll() is not None else ''}"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not list(store.glob("adapter/*/manifest.yaml")), "a killed run left a visible artifact"
    assert not Store(store).list("adapter")
    work = ckpt.parents[2]
    assert (work / "RESUMABLE").is_file()
    done = subprocess.run(
        _trace() + args + ["--resume"], env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from checkpoint-" in done.stderr
    res = json.loads(done.stdout)
    s = res["summary"]
    assert s["steps"] == steps and s["resumed_from_step"] >= 1
    assert s["rollouts"] == steps * 8
    rows = pq.read_table(store / "adapter" / res["id"] / "train_metrics.parquet").to_pylist()
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # the episodes each step trained on, once: the killed run's after its checkpoint were generated again
    info = pq.read_table(store / "adapter" / res["id"] / "episodes.parquet").column("info").to_pylist()
    assert sorted(json.loads(i)["step"] for i in info) == [n for n in range(1, steps + 1) for _ in range(8)]
    assert not work.exists(), "the work dir is removed once the artifact is committed"


@pytest.mark.slow
@pytest.mark.parametrize("form", ["module", "script"])
def test_accelerate_two_processes(model_dir, tmp_path, form):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU: both ranks train (gloo), rank 0 alone writes
    the artifact and the index, and prints the result once."""
    store = tmp_path / "store"
    launcher = [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(29500 + os.getpid() % 500),
    ]
    target = ["-m", "trace_cli"] if form == "module" else [str(BIN / "trace")]
    args = _train_args(
        model_dir,
        store,
        "--max-steps",
        "2",
        "--set",
        "per_device_batch_size=4",
        "--set",
        "checkpoint_every=1",
        "--json",
        "--name",
        "dp",
        env=TEST_ENV,
    )
    r = subprocess.run(
        launcher + target + args, env=_env(), capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout)  # exactly one JSON document: rank 1 prints nothing
    s = res["summary"]
    assert s["world_size"] == 2 and s["steps"] == 2
    assert s["episodes_per_step"] == 8 and s["rollouts"] == 16  # 4 per rank x 2 ranks
    arts = Store(store).list("adapter")
    assert [a.id for a in arts] == [res["id"]]
    assert not list((store / ".tmp").glob("*")), "no temp or work dirs are left behind"
    from trace_cli.store.sql import query

    _, rows = query(Store(store), "SELECT count(*) FROM artifacts WHERE kind = 'adapter'")
    assert rows[0][0] == 1
    assert Store(store).resolve("store://adapter/dp").id == res["id"]


class _Mix:
    """Calibration stand-in: follows the reference on a seeded 40 % of episodes (so synthesize admits the env)."""

    name = "mix"

    def begin(self, state):
        import random

        rng = random.Random(f"{state.seed}:{state.trial}")
        state.turns.append({"plan": list(state.env.reference_actions()) if rng.random() < 0.4 else []})

    def act(self, states):
        return [
            [s.turns[0]["plan"].pop(0)] if s.turns[0]["plan"] else [{"content": "Goodbye."}] for s in states
        ]


def test_trains_on_a_synthesized_environment(model_dir, tmp_path, monkeypatch):
    """`--env store://environment/NAME`: the artifact is an input (lineage), its capability is recorded, and its
    declared train seed range is used when `seeds` is not given."""
    import trace_cli.stages.synthesize as synth

    store = Store(tmp_path / "store")
    cap = "precondition_verification"
    make_diagnosis(store, [cap])
    monkeypatch.setattr(synth, "load_calibration_policy", lambda model, store, cfg: _Mix())
    execute(
        "synthesize",
        {
            "diagnosis": "store://diagnosis/diag",
            "capability": cap,
            "model": "policy:random",
            "calibration": {"seeds": 12, "rollouts": 8},
        },
        store,
        name="pv",
    )
    env_art = store.resolve("store://environment/pv")
    cfg = grpo_config(model_dir, env="store://environment/pv", max_steps=1)
    del cfg["seeds"]
    # lineage, not learning: one step of the random tiny model may see only constant-reward groups, which
    # fails the run (test_constant_reward_run_fails_and_stores_nothing)
    import trace_cli.training.checks as checks

    monkeypatch.setattr(checks, "nothing_learned", lambda rows, adapter_dir: None)
    out = execute("train", cfg, store, name="pv-adapter")
    art = out.main
    assert art.summary["capability"] == cap and art.summary["steps"] == 1
    assert (
        art.config["seeds"]
        == yaml.safe_load((env_art.path / "environment.yaml").read_text())["seeds"]["train"]
    )
    assert env_art.as_input("environment") in art.manifest["inputs"]


def test_constant_reward_run_fails_and_stores_nothing(model_dir, tmp_path, monkeypatch):
    """Every group with a constant reward = nothing learned: exit 1 (CheckFailed), no adapter artifact."""
    from trace_cli.envs.shop import ShopEnv
    from trace_cli.errors import CheckFailed

    monkeypatch.setattr(ShopEnv, "verify", _constant_verify(ShopEnv.verify))
    store = Store(tmp_path / "store")
    with pytest.raises(CheckFailed, match="constant reward") as e:
        execute("train", grpo_config(model_dir, env="shop", max_steps=1), store)
    assert e.value.exit_code == 1
    assert not list((tmp_path / "store").glob("adapter/*/manifest.yaml"))


def _constant_verify(real):
    def verify(self):
        b = real(self)
        b.reward, b.success = 0.0, False
        return b

    return verify


# ---------------------------------------------------------------------------------------------- report_to
def test_report_to_tensorboard_writes_live_metrics_and_keeps_the_id(trained, model_dir, tmp_path):
    """report_to=tensorboard hands TRL's TensorBoard callback a directory of event files with the reward per
    step; where metrics go is not part of what is trained, so the adapter id is the one of the plain run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store, plain = trained
    logs = tmp_path / "tb"
    out = execute(
        "train", grpo_config(model_dir, report_to="tensorboard", logging_dir=str(logs)), store, force=True
    )
    assert out.main.id == plain.main.id
    events = sorted(logs.rglob("events.out.tfevents.*"))
    assert events, f"no event file under {logs}"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    rewards = [e.value for e in acc.Scalars("train/reward")]
    assert len(rewards) == 2  # max_steps 2, logging every step
    metrics = pq.read_table(out.main.path / "train_metrics.parquet").to_pylist()
    assert rewards == pytest.approx([m["reward"] for m in metrics], abs=1e-6)


def test_report_to_a_missing_integration_exits_2_before_compute(model_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "trackio" else real(n, *a))
    store = tmp_path / "store"
    r = run_cli(*_train_args(model_dir, store, "--set", "report_to=trackio"))
    assert r.exit_code == 2 and "trackio package is not installed" in r.output
    assert not store.exists() or not any((store / "adapter").glob("*"))
