"""benchmarks/device: pack.py splits and rejoins a file with digest checks (how weights travel to a device
machine), and gpu_chain.py runs the whole chain end to end on the CPU (--device cpu --smoke)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

import pack  # noqa: E402


def test_split_and_join_round_trip_within_the_part_size(tmp_path):
    src = tmp_path / "w.gguf"
    data = os.urandom(5 * 1024 * 1024 + 123)
    src.write_bytes(data)
    manifest = pack.split(src, tmp_path / "parts", part_mib=2)
    doc = json.loads(manifest.read_text())
    assert [p["bytes"] for p in doc["parts"]] == [2 << 20, 2 << 20, (1 << 20) + 123]
    assert all((tmp_path / "parts" / p["name"]).stat().st_size <= 2 << 20 for p in doc["parts"])
    # parts carried by separate calls land in separate folders
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "parts" / doc["parts"][1]["name"]).rename(other / doc["parts"][1]["name"])
    assert pack.check(manifest) == [f"{doc['parts'][1]['name']}: missing"]
    out = pack.join(manifest, tmp_path / "joined.gguf", [tmp_path / "parts", other])
    assert out.read_bytes() == data


def test_a_corrupt_part_is_refused_and_nothing_is_left(tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(3 << 20))
    manifest = pack.split(src, tmp_path / "p", part_mib=1)
    part = tmp_path / "p" / "w.bin.part01"
    b = bytearray(part.read_bytes())
    b[100] ^= 0xFF
    part.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="part01: size or sha256 differs"):
        pack.join(manifest, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "out.bin.partial").exists()
    assert pack.main(["join", str(manifest), str(tmp_path / "out.bin")]) == 1


def test_gpu_chain_refuses_a_gpu_that_is_not_there(run_benchmark, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    out = tmp_path / "r.json"
    proc = run_benchmark("device/gpu_chain.py", "--device", "cuda", "--smoke", "--out", str(out), timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU is visible" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_make_gpu_smoke_runs_every_stage_on_the_cpu(tmp_path):
    """`make gpu-smoke` in its CPU mode (what a user runs first on a GPU box, sized for a few CPU minutes)."""
    import subprocess

    out, store = tmp_path / "gpu_chain.json", tmp_path / "store"
    venv = Path(sys.executable).parents[1]
    args = f"--device cpu --smoke --store {store} --out {out}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1"}
    # -o: the venv counts as installed (this test runs in it); a stale stamp must not reinstall mid-test
    cmd = [
        "make",
        "-C",
        str(REPO),
        "-o",
        f"{venv}/.installed",
        f"VENV={venv}",
        "gpu-smoke",
        f"GPU_SMOKE={args}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["device"]["name"] == "cpu" and doc["device"]["dtype"] == "float32"
    stages = doc["stages"]
    for label in ("init", "sft", "import", "eval", "diagnose", "synthesize_0", "grpo_0", "grpo_1"):
        assert stages[label]["wall_s"] > 0, label
    for label in ("compose_router", "compose_moe", "compose_merge", "real_import", "real_sft", "real_grpo"):
        assert label in stages
    assert stages["grpo_server"]["wall_s"] > 0 and stages["eval_server"]["wall_s"] > 0  # the server engine
    assert doc["failed"] == []
    assert stages["grpo_0"]["seconds_per_episode"] > 0 and stages["real_eval"]["gen_tokens_per_s"] > 0
    assert doc["serve"]["completion_tokens"] > 0 and doc["serve"]["request_s"] > 0
    assert "peak_mem_gib" not in stages["sft"]  # only measured on a GPU


def test_a_stage_that_fails_is_recorded_and_the_chain_goes_on(tmp_path):
    """A failing stage leaves its error in the JSON rows and the stages that needed it marked skipped; no
    exception reaches the caller (the real-model profile on a checkpoint that is not there)."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_chain

    saved = []
    run = gpu_chain.Run(tmp_path / "store", torch.device("cpu"), lambda: saved.append(dict(run.rows)))
    gpu_chain.real_profile(run, gpu_chain.SIZES["smoke"], str(tmp_path / "no-such-model"))
    assert "not found" in run.rows["real_import"]["error"]
    for label in ("real_sft", "real_eval", "real_grpo", "real_eval_adapter"):
        assert run.rows[label] == {"skipped": "needs real_import, which failed"}
    assert run.failed == ["real_import"]
    assert saved and "real_import" in saved[0]  # written as it happened
