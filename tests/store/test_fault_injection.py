"""Fault injection (issue 14): SIGKILL each stage at seeded random points, then check that nothing is lost.

For every kill: `trace store verify` passes, the index lists exactly the artifacts that have manifests
(`store sql` on the `artifacts` table = `store ls`), and a rerun completes with exactly the artifacts (same
ids) of an uninterrupted run in a twin store. The GRPO run uses the parity test environment (its reward
varies for a random model), registered in the child process before the real CLI's `main` runs.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trace_testing import BIN, REPO, TAU2_DIR, TAU2_FILES, episode, run_trace, write_jsonl

TRAINING = REPO / "tests" / "training"
PARITY_MAIN = (
    f"import sys; sys.path.insert(0, {str(TRAINING)!r}); from grpo_helpers import register_parity; "
    "register_parity(); from trace_cli.cli import main; main(sys.argv[1:])"
)
GRPO = [
    "train", "--method", "grpo", "--env", "grpo-parity", "--model", "store://model/tiny", "--seeds", "100:140",
    "--set", "num_generations=4", "--set", "per_device_batch_size=8", "--set", "gradient_accumulation_steps=1",
    "--set", "max_steps=2", "--set", "max_turns=2", "--set", "max_new_tokens=12",
    "--set", "max_completion_length=96", "--set", "checkpoint_every=0", "--set", "learning_rate=0.05",
    "--set", "lora.r=4", "--set", "lora.alpha=8",
]  # fmt: skip
SFT = [
    "train", "--method", "sft", "--env", "shop", "--model", "store://model/tiny", "--seeds", "100000:100016",
    "--set", "epochs=1", "--set", "batch_size=4",
]  # fmt: skip
RECIPE = """kind: recipe
version: 1
steps:
  - id: ingest
    uses: ingest
    with: {format: tau2, path: %s}
  - id: eval
    uses: eval
    with: {model: policy:reference, env: shop, seeds: '0:30'}
  - id: diagnose
    uses: diagnose
    with: {rollouts: '${steps.ingest.outputs.rollouts}', runs: 4, min_runs: 3}
"""
STAGES = {
    "ingest": ["ingest", "tau2", str(TAU2_DIR / TAU2_FILES["retail"])],
    "eval": ["eval", "--model", "policy:reference", "--env", "shop", "--seeds", "0:60"],
    "run": ["run", "{W}/recipe.yaml"],
    "sft": SFT,
    "grpo": GRPO,
}
KILLS = 3  # random points per stage


def _env() -> dict[str, str]:
    e = dict(os.environ, TRACE_NO_PROGRESS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    e.update(TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    e.pop("TRACE_STORE", None)
    return e


def _cmd(stage: str, store: Path, w: Path) -> list[str]:
    args = [a.replace("{W}", str(w)) for a in STAGES[stage]] + ["--store", str(store)]
    if stage == "grpo":
        return [sys.executable, "-c", PARITY_MAIN, *args]
    return [str(BIN / "trace"), *args]


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _artifacts(store: Path) -> set[tuple[str, str]]:
    r = run_trace("store", "ls", "--json", "--store", store)
    assert r.returncode == 0, r.stderr
    return {(a["kind"], a["id"]) for a in json.loads(r.stdout)}


def _indexed(store: Path) -> set[tuple[str, str]]:
    r = run_trace("store", "sql", "SELECT kind, id FROM artifacts", "--json", "--store", store)
    assert r.returncode == 0, r.stderr
    return {(a["kind"], a["id"]) for a in json.loads(r.stdout)}


def _consistent(store: Path, what: str) -> set[tuple[str, str]]:
    v = run_trace("store", "verify", "--store", store)
    assert v.returncode == 0, f"{what}: verify failed\n{v.stdout}\n{v.stderr}"
    listed = _artifacts(store)
    assert _indexed(store) == listed, f"{what}: the index disagrees with the manifests"
    return listed


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, Path]:
    """A store holding the tiny model (the base of both trainings) and a work dir with the recipe."""
    root = tmp_path_factory.mktemp("faults")
    w = root / "w"
    w.mkdir()
    (w / "recipe.yaml").write_text(RECIPE % (TAU2_DIR / TAU2_FILES["airline"]))
    write_jsonl(w / "e.jsonl", [episode("e1")])
    store = root / "template"
    r = run_trace("model", "init", "--preset", "tiny", "--name", "tiny", "--store", store, timeout=300)
    assert r.returncode == 0, r.stderr
    return store, w


def _kill_and_check(stage: str, template: tuple[Path, Path], tmp_path: Path) -> list[str]:
    base, w = template
    ref = tmp_path / "ref"
    shutil.copytree(base, ref)
    t0 = time.monotonic()
    r = _run(_cmd(stage, ref, w), w)
    took = time.monotonic() - t0
    assert r.returncode == 0, f"uninterrupted {stage} failed:\n{r.stderr[-3000:]}"
    want = _consistent(ref, f"{stage} uninterrupted")
    assert len(want) > len(_artifacts(base)), "the stage wrote no artifact"
    rng = random.Random(f"{stage}-kills")
    report = []
    for k in range(KILLS):
        delay = rng.uniform(0.25, 0.98) * took  # the first ~second is imports
        store = tmp_path / f"kill{k}"
        shutil.copytree(base, store)
        p = subprocess.Popen(
            _cmd(stage, store, w), cwd=w, env=_env(), start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(delay)
        finished = p.poll() is not None
        if not finished:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        what = f"{stage} killed at {delay:.2f}s of {took:.1f}s"
        after_kill = _consistent(store, what)
        assert after_kill <= want, (
            f"{what}: artifacts that an uninterrupted run does not make: {after_kill - want}"
        )
        again = _run(_cmd(stage, store, w), w)
        assert again.returncode == 0, f"{what}: the rerun failed\n{again.stderr[-3000:]}"
        assert _consistent(store, f"{what}, rerun") == want, f"{what}: the rerun gave other artifacts"
        report.append(f"{delay:.2f}/{took:.1f}s{' (finished first)' if finished else ''}")
    return report


@pytest.mark.parametrize("stage", ["ingest", "eval", "run"])
def test_kill_fast_stages(stage, template, tmp_path):
    kills = _kill_and_check(stage, template, tmp_path)
    print(f"{stage}: {kills}")


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_kill_training(stage, template, tmp_path):
    kills = _kill_and_check(stage, template, tmp_path)
    print(f"{stage}: {kills}")
