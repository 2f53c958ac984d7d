#!/usr/bin/env python
"""Serve benchmark: requests/s and generated tokens/s of `trace serve` at concurrency 1, 4 and 16.

1. Builds the `small` preset offline (`trace model init --preset small`) in a temp store (or reuses --store).
2. Starts a real `trace serve` subprocess on a free loopback port.
3. For each concurrency level, that many client threads (official `openai` SDK) send greedy chat completions
   with the shop world's tools and real opening conversations (seeds 0..), max_tokens fixed, for a fixed
   number of requests; requests join the server's running batch between tokens (continuous batching).
4. Prints a table with each level's tokens/s as a ratio to concurrency 1 (goal, issue 24: >= 3x at 16) and
   writes JSON (benchmarks/results/serve_bench.json) with machine info.

    python benchmarks/serve_bench.py                 # 48 requests per level, max_tokens 64
    python benchmarks/serve_bench.py --quick         # 16 requests per level
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(n: int) -> list[tuple[list[dict], list[dict]]]:
    from trace_cli.envs.registry import make_env

    out = []
    for seed in range(n):
        obs = make_env("shop").reset(seed)
        out.append(([{"role": "system", "content": obs.system_prompt}, *obs.messages], obs.tools))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--store", help="Reuse this store (builds store://model/bench-small if absent).")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve_bench.json"))
    args = ap.parse_args()
    n_req = 16 if args.quick else args.requests
    levels = [int(x) for x in args.levels.split(",")]
    store = Path(args.store or tempfile.mkdtemp(prefix="serve-bench-"))
    env = {**os.environ, "TRACE_NO_PROGRESS": "1"}
    trace = str(BIN / "trace")
    t0 = time.monotonic()
    subprocess.run([trace, "model", "init", "--preset", "small", "--name", "bench-small", "--store", str(store)],
                   check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    build_s = time.monotonic() - t0
    port = _port()
    proc = subprocess.Popen(
        [trace, "serve", "store://model/bench-small", "--port", str(port), "--store", str(store)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    import openai

    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
    try:
        for _ in range(600):
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if proc.poll() is not None:
                    print(proc.stderr.read(), file=sys.stderr)
                    return 1
                time.sleep(0.2)
        prompts = _prompts(n_req)

        def one(i: int) -> int:
            msgs, tools = prompts[i % len(prompts)]
            r = client.chat.completions.create(
                model="bench-small", messages=msgs, tools=tools, temperature=0, max_tokens=args.max_tokens
            )
            return r.usage.completion_tokens

        one(0)  # warm-up
        rows = []
        for c in levels:
            t = time.monotonic()
            with ThreadPoolExecutor(max_workers=c) as pool:
                toks = list(pool.map(one, range(n_req)))
            wall = time.monotonic() - t
            rows.append(
                {
                    "concurrency": c,
                    "requests": n_req,
                    "wall_s": round(wall, 2),
                    "requests_per_s": round(n_req / wall, 2),
                    "tokens_per_s": round(sum(toks) / wall, 1),
                    "mean_completion_tokens": round(sum(toks) / n_req, 1),
                }
            )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    base_tps = rows[0]["tokens_per_s"] if rows and rows[0]["concurrency"] == 1 else None
    for r in rows:
        r["x_concurrency_1"] = round(r["tokens_per_s"] / base_tps, 2) if base_tps else None
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[k]) for k in cols))
    import torch

    result = {
        "benchmark": "serve",
        "model": "small preset (trace model init --preset small)",
        "max_tokens": args.max_tokens,
        "build_s": round(build_s, 1),
        "rows": rows,
        "goal": {"concurrency": 16, "x_concurrency_1": 3.0},
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
