#!/usr/bin/env python
"""Serve benchmark: requests/s and generated tokens/s of `trace serve` at concurrency 1, 4 and 16.

1. Builds the `small` preset offline (`trace model init --preset small`) in a temp store (or reuses --store).
2. Starts a real `trace serve` subprocess on a free loopback port (its log goes to a file, so a long run never
   blocks on a full pipe; the server is stopped on any exit, Ctrl-C and SIGTERM included). With
   $TRACE_SERVE_API_KEY set the server requires that key and the client sends it.
3. For each concurrency level, that many client threads (official `openai` SDK) send greedy chat completions
   with the shop world's tools and real opening conversations (seeds 0..), max_tokens fixed, for a fixed
   number of requests; requests join the server's running batch between tokens (continuous batching).
4. Prints a table with each level's tokens/s as a ratio to concurrency 1 (goal, issue 24: >= 3x at 16) and
   writes JSON with machine info to a new file in benchmarks/results/ (never the committed results) unless
   --out names one.

    python benchmarks/serve_bench.py                 # 48 requests per level, max_tokens 64
    python benchmarks/serve_bench.py --quick         # 16 requests per level
    python benchmarks/serve_bench.py --out benchmarks/results/serve_bench.json   # replace the committed file
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import RESULTS, command, log, machine, print_table, write_result

BIN = Path(sys.executable).parent
MODEL = "bench-small"


def _port() -> int:
    import socket

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


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C (a clean stop), then kill after 30 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
        return
    proc.kill()
    proc.wait()


@contextlib.contextmanager
def served(store: Path, *extra: str):
    """A `trace serve` of store://model/bench-small on a free port: yields (openai client, base URL); the
    server is stopped however the block ends."""
    import openai

    port = _port()
    key = os.environ.get("TRACE_SERVE_API_KEY")  # the server reads it from the environment too
    log_path = Path(tempfile.mkstemp(prefix="serve-bench-", suffix=".log")[1])
    with log_path.open("w") as err:
        proc = subprocess.Popen(
            [str(BIN / "trace"), "serve", f"store://model/{MODEL}", "--port", str(port), "--store", str(store),
             *extra],
            env={**os.environ, "TRACE_NO_PROGRESS": "1"}, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key=key or "none", max_retries=0, timeout=600)
    try:
        for _ in range(600):
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield client, base
    finally:
        _stop(proc)
        log(f"server log: {log_path}")


def throughput(client, n_req: int, levels: list[int], max_tokens: int) -> list[dict]:
    prompts = _prompts(n_req)

    def one(i: int) -> int:
        msgs, tools = prompts[i % len(prompts)]
        r = client.chat.completions.create(
            model=MODEL, messages=msgs, tools=tools, temperature=0, max_tokens=max_tokens
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
    base_tps = rows[0]["tokens_per_s"] if rows and rows[0]["concurrency"] == 1 else None
    for r in rows:
        r["x_concurrency_1"] = round(r["tokens_per_s"] / base_tps, 2) if base_tps else None
    return rows


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `served`, which stops the server


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kw in (
        ("--quick", {"action": "store_true"}),
        ("--requests", {"type": int, "default": 48}),
        ("--max-tokens", {"type": int, "default": 64}),
        ("--levels", {"default": "1,4,16"}),
        ("--store", {"help": "Reuse this store (builds store://model/bench-small if absent)."}),
        ("--out", {"help": "Result file (default: a new benchmarks/results/serve_bench-TIME.json)."}),
    ):
        ap.add_argument(flag, **kw)
    return ap.parse_args()


def main() -> int:
    args = _args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    n_req = 16 if args.quick else args.requests
    levels = [int(x) for x in args.levels.split(",")]
    store = Path(args.store or tempfile.mkdtemp(prefix="serve-bench-"))
    t0 = time.monotonic()
    subprocess.run([str(BIN / "trace"), "model", "init", "--preset", "small", "--name", MODEL, "--store", str(store)],
                   check=True, env={**os.environ, "TRACE_NO_PROGRESS": "1"}, stdout=subprocess.DEVNULL)  # fmt: skip
    build_s = time.monotonic() - t0
    with served(store) as (client, _):
        rows = throughput(client, n_req, levels, args.max_tokens)
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    import torch

    result = {
        "benchmark": "serve",
        "command": command(),
        "model": "small preset (trace model init --preset small)",
        "max_tokens": args.max_tokens,
        "build_s": round(build_s, 1),
        "rows": rows,
        "goal": {"concurrency": 16, "x_concurrency_1": 3.0},
        "machine": machine("torch", torch_threads=torch.get_num_threads(), cuda=torch.cuda.is_available(),
                           OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")),
    }  # fmt: skip
    out = Path(args.out) if args.out else RESULTS / f"serve_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    print(f"wrote {write_result(out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
