"""GRPO, calibration and eval on the `server` rollout engine against a real `trace serve --enable-lora` on a loopback
port (issue 47's acceptance): training loads the adapter into the server before every step's rollouts and records
the version each episode was sampled with; a greedy eval of the trained adapter through the server equals the hf
engine's, episode by episode; greedy calibration through the server finds the same success as on hf."""

from __future__ import annotations

import json
import math

import pytest
import tinymodel  # noqa: E402
from grpo_helpers import set_env  # noqa: E402
from serving import http, trace_serve  # noqa: E402
from trace_testing import make_diagnosis, run_cli  # noqa: E402

from trace_cli.stages.base import execute  # noqa: E402
from trace_cli.store import Store  # noqa: E402

CAP = "precondition_verification"


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


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with the tiny model and a synthesized environment, and `trace serve` of that model with LoRA."""
    set_env()
    tiny = tinymodel.tiny(tmp_path_factory)
    root = tmp_path_factory.mktemp("engine-store") / "store"
    store = Store(root)
    make_diagnosis(store, [CAP])
    import trace_cli.stages.synthesize as synth

    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "load_calibration_policy", lambda model, store, cfg: _Mix())
    try:
        execute(
            "synthesize",
            {
                "diagnosis": "store://diagnosis/diag",
                "capability": CAP,
                "model": "policy:random",
                "calibration": {"seeds": 12, "rollouts": 8},
            },
            store,
            name="pv",
        )
    finally:
        mp.undo()
    Store(tiny.store_root).set_name("model", "tiny", tiny.id)
    log = tmp_path_factory.mktemp("engine-serve") / "serve.log"
    with trace_serve("store://model/tiny", tiny.store_root, log, "--max-batch", "64") as srv:
        yield tiny, root, srv


def _episodes(root, out: str) -> dict[str, dict]:
    from trace_cli.store.rollouts import read_episodes

    uri = json.loads(out)["rollouts"]
    return {e["episode_id"]: e for e in read_episodes(Store(root).resolve(uri).path)}


def _train_and_compare(world, env: str, name: str, *extra: str):
    """`trace train --method grpo` for 3 steps with rollout.engine=server; checks what the server and the adapter
    record; then a greedy `trace eval` of the adapter through the server = on hf, episode by episode. Returns the
    adapter artifact."""
    tiny, root, srv = world
    url = ["--set", f"rollout.url={srv.base}"]
    res = run_cli(
        "train",
        "--method",
        "grpo",
        "--env",
        env,
        "--model",
        str(tiny.hf),
        "--store",
        str(root),
        "--name",
        name,
        "--json",
        *("--set", "rollout.engine=server", *url),
        *("--set", "max_steps=3", "--set", "num_generations=4", "--set", "per_device_batch_size=8"),
        *("--set", "gradient_accumulation_steps=1", "--set", "max_new_tokens=16"),
        *("--set", "max_completion_length=160", "--set", "learning_rate=0.05", "--set", "lora.r=4"),
        *("--set", "checkpoint_every=0", *extra),
    )
    assert res.exit_code == 0, res.output
    art = Store(root).resolve(f"store://adapter/{name}")
    assert art.summary["steps"] == 3
    loads = art.summary["rollout"]["adapter_loads"]
    prefix = f"train-{art.id}"
    assert [x["version"] for x in loads] == [f"{prefix}-step-{n}" for n in range(3)]
    log = srv.log_text()
    for n in range(3):  # the server loaded one adapter version per step, before that step's rollouts
        assert f"lora adapter loaded: {prefix}-step-{n} " in log
    assert f"lora adapter unloaded: {prefix}-step-2" in log  # the run leaves the server as it found it
    assert http("GET", f"{srv.base}/models")[1]["data"][1:] == []

    from trace_cli.store.rollouts import read_episodes
    from trace_cli.training.episode_log import episode_info

    kept = read_episodes(art.path)
    for e in kept:  # each episode names the adapter version it was sampled with: the one before its step
        info = episode_info(e)
        assert info["adapter_version"] == f"{prefix}-step-{info['step'] - 1}"
    assert {episode_info(e)["step"] for e in kept} == {1, 2, 3}

    # the trained adapter, greedy, through the server (loaded as a LoRA) = on hf in this process
    common = ["--env", env, "--seeds", "0:12", "--max-turns", "3", "--max-new-tokens", "16"]
    common += ["--store", str(root), "--json"]
    ref = f"store://adapter/{name}"
    hf = run_cli("eval", "--model", ref, *common)
    assert hf.exit_code == 0, hf.output
    served = run_cli("eval", "--model", ref, *common, "--set", "rollout.engine=server", *url)
    assert served.exit_code == 0, served.output
    assert (
        json.loads(served.stdout)["rollouts"] != json.loads(hf.stdout)["rollouts"]
    )  # two runs, not one reused
    a, b = _episodes(root, hf.stdout), _episodes(root, served.stdout)
    assert sorted(a) == sorted(b) and len(a) == 12
    for eid, e in a.items():
        assert e["messages"] == b[eid]["messages"], eid
        assert (e["reward"], e["success"], e["termination_reason"]) == (
            b[eid]["reward"],
            b[eid]["success"],
            b[eid]["termination_reason"],
        )
    ev_hf = Store(root).resolve(json.loads(hf.stdout)["eval"]).summary
    ev_sv = Store(root).resolve(json.loads(served.stdout)["eval"]).summary
    assert ev_sv["engine"] == "server" and ev_hf["engine"] == "hf"
    assert math.isclose(ev_sv["pass@1"], ev_hf["pass@1"], abs_tol=1e-9)
    assert math.isclose(ev_sv["mean_reward"], ev_hf["mean_reward"], abs_tol=1e-9)
    assert f"lora adapter unloaded: {art.id}" in srv.log_text()  # eval unloads what it loaded
    return art


@pytest.mark.slow
def test_grpo_on_a_synthesized_environment_through_the_server(world):
    """The acceptance run: `--env store://environment/…` with rollout.engine=server (the tiny model gets a
    constant reward there, so require_learning is off: this is about the engine, not learning)."""
    _train_and_compare(world, "store://environment/pv", "pv-on-server", "--set", "require_learning=false")


@pytest.mark.slow
def test_grpo_through_the_server_learns_and_serves_what_it_learned(world):
    """On the parity environment (rewards vary within groups) the adapter trained through the server moves
    (require_learning holds), and the server's greedy tokens with it differ from the base's."""
    from grpo_helpers import TEST_ENV, register_parity

    from trace_cli.training.checks import nothing_learned

    register_parity()
    art = _train_and_compare(
        world, TEST_ENV, "parity-on-server", "--seeds", "100:140", "--set", "max_turns=2"
    )
    assert nothing_learned([], art.path / "adapter") is None  # lora_B is not zero
    _, _, srv = world
    http("POST", f"{srv.base}/load_lora_adapter", {"lora_name": "p", "lora_path": str(art.path / "adapter")})
    try:
        body = {"prompt": list(range(5, 40)), "max_tokens": 8, "temperature": 0.0, "logprobs": 0}
        lp = [http("POST", f"{srv.base}/completions", {**body, "model": m})[1] for m in ("tiny", "p")]
        first = [x["choices"][0]["logprobs"]["token_logprobs"][0] for x in lp]
        assert not math.isclose(first[0], first[1], abs_tol=1e-6)
    finally:
        http("POST", f"{srv.base}/unload_lora_adapter", {"lora_name": "p"})


def base_config(tiny) -> dict:
    """synthesize, greedy, a small calibration of the tiny model: one attempt of 8 seeds x 2 rollouts."""
    return {
        "diagnosis": "store://diagnosis/diag",
        "capability": CAP,
        "model": str(tiny.hf),
        "calibration": {
            "seeds": 8,
            "rollouts": 2,
            "temperature": 0.0,
            "max_new_tokens": 16,
            "max_completion_length": 160,
            "max_attempts": 1,
            "min_seeds": 8,
            "look": 0,
        },
    }


@pytest.mark.slow
def test_greedy_calibration_through_the_server_equals_hf(world):
    """synthesize's calibration (GRPO's token sampler, greedy) on the server finds the same success per attempt
    as on hf; out of band or not, both runs report the same numbers."""
    tiny, root, srv = world
    from trace_cli.errors import CheckFailed

    def calibrate(engine: dict) -> list[dict]:
        cfg = {**base_config(tiny), "rollout": engine}
        try:
            out = execute("synthesize", cfg, Store(root))
        except CheckFailed as e:
            assert "attempts" in getattr(e, "details", {}), str(e)
            return e.details["attempts"]
        from trace_cli.envs.artifact import read_environment

        return read_environment(out.main)["calibration"]["attempts"]

    on_hf = calibrate({"engine": "hf"})
    on_server = calibrate({"engine": "server", "url": srv.base})
    assert len(on_hf) == len(on_server) == 1
    for a, b in zip(on_hf, on_server, strict=True):
        assert a["rollouts"] == b["rollouts"] > 0
        assert math.isclose(a["mean_success"], b["mean_success"], abs_tol=1e-9), (a, b)
        assert math.isclose(a["mean_reward"], b["mean_reward"], abs_tol=1e-9), (a, b)

    # what calibration generates, token for token: its policy (GRPO's token sampler) on each engine
    import trace_cli.stages.synthesize as synth
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import rollout
    from trace_cli.models.refs import resolve_model

    ref = resolve_model(str(tiny.hf), Store(root))
    episodes = []
    for engine in ({"engine": "hf"}, {"engine": "server", "url": srv.base}):
        cfg = synth.prepare({**base_config(tiny), "rollout": engine}, Store(root)).config
        policy = synth.load_calibration_policy(ref, Store(root), cfg)
        env = lambda: make_env("store://environment/pv", store=Store(root))  # noqa: E731
        episodes.append(rollout(policy, env, [(s, 0) for s in range(100, 108)], max_turns=4, batch_size=8))
    for a, b in zip(*episodes, strict=True):
        assert [t["completion_ids"] for t in a.turns] == [t["completion_ids"] for t in b.turns]
        assert [t["prompt_ids"] for t in a.turns] == [t["prompt_ids"] for t in b.turns]
        assert (a.reward, a.success, a.messages) == (b.reward, b.success, b.messages)
    assert sum(len(t["completion_ids"]) for r in episodes[0] for t in r.turns) > 8 * 4


def _trainer_logps(model, seq) -> list[float]:
    """The trainer's log-probabilities of a sequence's completion tokens (its prompt as trained on)."""
    import torch

    ids = list(seq["prompt_ids"]) + list(seq["completion_ids"])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    n = len(seq["prompt_ids"])
    lps = logits.log_softmax(-1)[n - 1 : -1].gather(-1, torch.tensor(seq["completion_ids"])[:, None])[:, 0]
    return lps.tolist()


def _sequence_ratio(old: list[float], sampled: list[float], mask: list[int]) -> float:
    """TRL 1.16's sequence-level importance ratio (GRPOTrainer._generate_and_score_completions): exp of the
    masked sum of (trainer - sampler) log-probabilities, a NaN difference counted as 0."""
    total = 0.0
    for o, s, m in zip(old, sampled, mask, strict=True):
        d = (o - s) * m
        total += 0.0 if math.isnan(d) else d
    return math.exp(total)


@pytest.mark.slow
def test_server_logprobs_feed_trls_correction_and_hinted_episodes_stay_out_of_it(world):
    """Episodes sampled on the server carry the sampler's log-probabilities, which match the trainer's own
    (ratio ~1); a hinted episode (sampled with the hint, trained without it) gets NaN ones, so TRL's
    correction leaves it at ratio 1 instead of masking it out, as its real sampler log-probabilities would."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.agents.engines import ServedModel
    from trace_cli.agents.token_history import TokenPolicy
    from trace_cli.envs.registry import make_env
    from trace_cli.training.grpo_rollout import group_episodes, rollout_columns

    tiny, root, srv = world
    tok = AutoTokenizer.from_pretrained(tiny.hf, padding_side="left")
    engine = ServerEngine(srv.base, None, None, 60.0, 8)
    engine.check()
    policy = TokenPolicy(
        ServedModel.of(tiny.hf), tok, 16, 160, temperature=1.0, top_p=1.0, top_k=0, seed=3, engine=engine
    )
    env = lambda: make_env("store://environment/pv", store=Store(root))  # noqa: E731
    results, seqs = group_episodes(policy, env, [100] * 4 + [101] * 4, 1, max_turns=3, batch_size=8)
    cols = rollout_columns(
        seqs, [(r.reward, r.success, r.n_actions, r.termination) for r in results], logprobs=True
    )
    model = AutoModelForCausalLM.from_pretrained(tiny.hf).eval()
    hinted = [i for i, r in enumerate(results) if r.trial in (0, 4)]
    assert hinted == [0, 4]
    for i, seq in enumerate(seqs):
        sampled, mask = cols["logprobs"][i], cols["env_mask"][i]
        old = _trainer_logps(model, seq)
        if i in hinted:
            assert all(math.isnan(x) for x in sampled)
            assert _sequence_ratio(old, sampled, mask) == 1.0
            real = [x for t in results[i].turns for x in t["logprobs"]]  # what the sampler saw, with the hint
            gen = [o for o, m in zip(old, mask, strict=True) if m]
            assert len(real) == len(gen)
            assert max(abs(g - r) for g, r in zip(gen, real, strict=True)) > 1e-3  # of another context
        else:
            assert all(math.isfinite(x) for x, m in zip(sampled, mask, strict=True) if m)
            gen = [(o, x) for o, x, m in zip(old, sampled, mask, strict=True) if m]
            assert [x for _, x in gen] == pytest.approx([o for o, _ in gen], abs=1e-4)
            assert _sequence_ratio(old, sampled, mask) == pytest.approx(1.0, abs=1e-3)


from trace_cli.agents.engines import ServerEngine  # noqa: E402


@pytest.mark.slow
def test_validation_runs_on_the_server_and_scores_as_on_hf(world):
    """Early-stopping validation of a GRPO run on the server engine evaluates through the server: the version of
    the last step is loaded by validation alone (no rollouts follow it), and at step 0 (the untrained LoRA, i.e.
    the base) it scores exactly what the same run scores on hf. Later steps' adapters differ between the two runs
    (their rollouts are sampled on different engines), so their scores are not compared."""
    from grpo_helpers import TEST_ENV, register_parity

    tiny, root, srv = world
    register_parity()

    def train(name: str, *engine: str):
        res = run_cli(
            "train", "--method", "grpo", "--env", TEST_ENV, "--model", str(tiny.hf), "--store", str(root),
            "--name", name, "--seeds", "100:140", *engine,
            *("--set", "max_steps=2", "--set", "num_generations=4", "--set", "per_device_batch_size=8"),
            *("--set", "gradient_accumulation_steps=1", "--set", "max_new_tokens=12", "--set", "max_turns=2"),
            *("--set", "max_completion_length=96", "--set", "learning_rate=0.05", "--set", "lora.r=4"),
            *("--set", "checkpoint_every=0", "--set", "require_learning=false"),
            *("--set", "validation.seeds=0:6", "--set", "validation.every=1", "--set", "validation.patience=5"),
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        return Store(root).resolve(f"store://adapter/{name}")

    on_server = train("val-server", "--set", "rollout.engine=server", "--set", f"rollout.url={srv.base}")
    on_hf = train("val-hf")
    sv, hf = on_server.summary["validation"]["history"], on_hf.summary["validation"]["history"]
    assert [h["step"] for h in sv] == [h["step"] for h in hf] == [0, 1, 2]
    assert math.isclose(sv[0]["reward"], hf[0]["reward"], abs_tol=1e-9)
    versions = [x["version"] for x in on_server.summary["rollout"]["adapter_loads"]]
    assert versions == [f"train-{on_server.id}-step-{n}" for n in range(3)]  # step 2: validation's own load


@pytest.mark.slow
def test_two_processes_sample_from_the_version_rank_0_loads(world, tmp_path):
    """`accelerate launch --num_processes 2` (CPU, gloo) with rollout.engine=server: rank 0 alone saves and loads
    each step's adapter, both ranks sample with it (their kept episodes name it), nothing deadlocks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from grpo_helpers import ENV_VARS, TEST_ENV
    from trace_testing import BIN, REPO

    from trace_cli.store.rollouts import read_episodes
    from trace_cli.training.episode_log import episode_info

    tiny, _, srv = world
    site = tmp_path / "site"
    site.mkdir()
    helpers = Path(__file__).resolve().parent
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(helpers)!r})\nfrom grpo_helpers import register_parity\nregister_parity()\n"
    )
    env = {**os.environ, **ENV_VARS, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("TRACE_STORE", None)
    store = tmp_path / "store"
    launcher = [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
    ]
    launcher += [
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(29000 + os.getpid() % 500),
    ]
    args = ["train", "--method", "grpo", "--env", TEST_ENV, "--model", str(tiny.hf), "--store", str(store)]
    args += ["--seeds", "100:140", "--json", "--name", "dp-server", "--set", "rollout.engine=server"]
    args += ["--set", f"rollout.url={srv.base}", "--set", "max_steps=2", "--set", "num_generations=4"]
    args += [
        "--set",
        "per_device_batch_size=4",
        "--set",
        "gradient_accumulation_steps=1",
        "--set",
        "max_turns=2",
    ]
    args += ["--set", "max_new_tokens=12", "--set", "max_completion_length=96", "--set", "lora.r=4"]
    args += ["--set", "checkpoint_every=0", "--set", "require_learning=false", "--set", "learning_rate=0.05"]
    target = [str(BIN / "trace")] if (BIN / "trace").exists() else [sys.executable, "-m", "trace_cli"]
    r = subprocess.run(
        launcher + target + args, env=env, capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout)
    art = Store(store).resolve(res["uri"])
    assert art.summary["world_size"] == 2 and art.summary["steps"] == 2
    prefix = f"train-{art.id}"
    loads = art.summary["rollout"]["adapter_loads"]
    assert [x["version"] for x in loads] == [f"{prefix}-step-0", f"{prefix}-step-1"]
    log = srv.log_text()
    assert log.count(f"lora adapter loaded: {prefix}-step-0 ") == 1  # by rank 0 only
    kept = read_episodes(art.path)
    ranks = {e["episode_id"].split("-")[1] for e in kept}
    assert ranks == {"r0", "r1"}
    for e in kept:
        info = episode_info(e)
        assert info["adapter_version"] == f"{prefix}-step-{info['step'] - 1}"
