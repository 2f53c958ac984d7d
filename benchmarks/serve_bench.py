#!/usr/bin/env python
"""Serve benchmark: requests/s and generated tokens/s of `trace serve` at concurrency 1, 4 and 16.

1. Builds the `small` preset offline (`trace model init --preset small`) in a temp store (or reuses --store).
2. Starts a real `trace serve` subprocess on a free loopback port (its log goes to a file, so a long run never
   blocks on a full pipe; the server is stopped on any exit, Ctrl-C and SIGTERM included). With
   $TRACE_SERVE_API_KEY set the server requires that key and the client sends it.
3. For each concurrency level, that many client threads (official `openai` SDK) send greedy chat completions
   with the shop world's tools and real opening conversations (seeds 0..), max_tokens fixed, for a fixed
   number of requests; requests join the server's running batch between tokens (continuous batching).
4. Prints a table with each level's tokens/s as a ratio to concurrency 1 (goal, issue 24: >= 3x at 16).
5. The τ²-like workload (`prefix_cache_speedup` in the JSON): 8 concurrent multi-turn conversations after a
   shared 5,000-token system prompt (the shop's prompt, tool schemas and policy paragraphs; the small preset
   served from a copy whose config allows 8,192 positions), greedy, against a server with the prefix cache
   (its default) and one without (--prefix-cache-mib 0): prompt tokens prefilled per turn (usage
   prompt_tokens - prompt_tokens_details.cached_tokens), turn latency, and whether every reply is the same
   (goal, issue 34: >= 5x fewer prefill tokens per turn, >= 3x lower turn latency, same replies).
6. Long prefill (`long_prefill`): while a stream decodes, a 6,000-token prompt arrives; the longest gap between
   the stream's chunks during its prefill, and the seconds until the server is idle after a client that
   disconnects during its prefill, with chunked prefill (the default) and in one pass (--prefill-chunk 0)
   (goal, issue 34: no gap over 1 s, idle within 1 s).
7. Writes JSON with machine info to a new file in benchmarks/results/ (never the committed results) unless
   --out names one.

    python benchmarks/serve_bench.py                 # 48 requests per level, max_tokens 64
    python benchmarks/serve_bench.py --quick         # 16 requests per level
    python benchmarks/serve_bench.py --workload tau2 --turns 3   # only the τ²-like workload
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
def served(store: Path, *extra: str, ref: str = f"store://model/{MODEL}"):
    """A `trace serve` of `ref` on a free port: yields (openai client, base URL); the server is stopped
    however the block ends."""
    import openai

    port = _port()
    key = os.environ.get("TRACE_SERVE_API_KEY")  # the server reads it from the environment too
    log_path = Path(tempfile.mkstemp(prefix="serve-bench-", suffix=".log")[1])
    with log_path.open("w") as err:
        proc = subprocess.Popen(
            [str(BIN / "trace"), "serve", ref, "--port", str(port), "--store", str(store), "--name", MODEL, *extra],
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


def long_context_copy(store: Path, positions: int = 8192) -> Path:
    """The small preset's weights as an HF directory whose config allows `positions` (RoPE: the weights
    do not change) so a 5k-token prompt fits; the store's artifact is left as it is."""
    import json
    import shutil

    from trace_cli.store import Store

    out = Path(tempfile.mkdtemp(prefix="serve-bench-8k-")) / MODEL
    shutil.copytree(Store(store).resolve(f"store://model/{MODEL}").path / "hf", out)
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        doc = json.loads((out / name).read_text())
        (out / name).write_text(json.dumps({**doc, key: positions}))
    return out


def _shared_prefix(tok, n_tokens: int) -> str:
    """A τ²-bench-like system prompt of about `n_tokens`: the shop's system prompt and tool schemas, then
    policy paragraphs, as every conversation of a domain shares them."""
    import json

    from trace_cli.envs.registry import make_env

    obs = make_env("shop").reset(0)
    text = obs.system_prompt + "\n\n# Tools\n" + json.dumps(obs.tools) + "\n\n# Policy\n"
    k = 0
    while len(tok(text, add_special_tokens=False)["input_ids"]) < n_tokens:
        k += 1
        text += f"{k}. Before acting on order #W{1000000 + k}, confirm the user's identity and the order id. "
    return text


def conversations(client, system: str, n_conv: int, turns: int, max_tokens: int) -> dict:
    """`n_conv` concurrent conversations of `turns` user turns each after the shared system prompt: per
    turn the latency and the prompt tokens prefilled (not served from the prefix cache), and every reply."""
    client.chat.completions.create(  # the prefix as an earlier conversation left it (not measured)
        model=MODEL, messages=[{"role": "system", "content": system}], temperature=0, max_tokens=1
    )

    def one(c: int) -> list[tuple[float, int, int, str]]:
        msgs, out = [{"role": "system", "content": system}], []
        for t in range(turns):
            msgs.append(
                {"role": "user", "content": f"Hi, I am customer {c}. Question {t}: where is #W{c}{t}?"}
            )
            t0 = time.monotonic()
            r = client.chat.completions.create(
                model=MODEL, messages=msgs, temperature=0, max_tokens=max_tokens
            )
            u = r.usage
            cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
            reply = r.choices[0].message.content or ""
            out.append((time.monotonic() - t0, u.prompt_tokens - cached, u.prompt_tokens, reply))
            msgs.append({"role": "assistant", "content": reply})
        return out

    t = time.monotonic()
    with ThreadPoolExecutor(max_workers=n_conv) as pool:
        runs = list(pool.map(one, range(n_conv)))
    rows = [r for run in runs for r in run]
    return {
        "wall_s": round(time.monotonic() - t, 2),
        "turns": len(rows),
        "mean_turn_latency_s": round(sum(r[0] for r in rows) / len(rows), 3),
        "mean_prefill_tokens_per_turn": round(sum(r[1] for r in rows) / len(rows), 1),
        "mean_prompt_tokens_per_turn": round(sum(r[2] for r in rows) / len(rows), 1),
        "replies": [[r[3] for r in run] for run in runs],
    }


def tau2_like(store: Path, args) -> dict:
    """The τ²-like workload with the prefix cache on (the server's default) and off: prefill tokens per
    turn and turn latency, off / on, and whether every reply is the same."""
    from transformers import AutoTokenizer

    model_dir = long_context_copy(store)
    system = _shared_prefix(AutoTokenizer.from_pretrained(model_dir), args.prefix_tokens)
    res = {}
    for label, extra in (("cache_on", ()), ("cache_off", ("--prefix-cache-mib", "0"))):
        with served(store, *extra, ref=str(model_dir)) as (client, _):
            res[label] = conversations(client, system, args.conversations, args.turns, args.max_tokens)
            log(f"{label}: { ({k: v for k, v in res[label].items() if k != 'replies'}) }")
    on, off = res["cache_on"], res["cache_off"]
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "shared_prefix_tokens": args.prefix_tokens,
        "max_tokens": args.max_tokens,
        "prefill_tokens_per_turn_x": round(off["mean_prefill_tokens_per_turn"] / max(1.0, on["mean_prefill_tokens_per_turn"]), 2),
        "turn_latency_x": round(off["mean_turn_latency_s"] / on["mean_turn_latency_s"], 2),
        "same_outputs": on.pop("replies") == off.pop("replies"),
        "cache_on": on,
        "cache_off": off,
        "goal": {"prefill_tokens_per_turn_x": 5.0, "turn_latency_x": 3.0},
    }  # fmt: skip


def _stats(base: str) -> dict:
    import json
    import urllib.request

    key = os.environ.get("TRACE_SERVE_API_KEY")
    req = urllib.request.Request(
        base.rsplit("/v1", 1)[0] + "/stats", headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def stall_and_cancel(client, base: str, long_prompt: str) -> dict:
    """While a stream decodes, a long prompt arrives: the longest gap between the stream's chunks during that
    prefill. Then the same prompt (another opening, nothing cached) is sent streaming and closed at its first
    chunk, during its prefill: seconds until the server runs nothing."""
    import threading

    short = [{"role": "user", "content": "Where is my order?"}]
    stream = client.chat.completions.create(
        model=MODEL, messages=short, temperature=0, max_tokens=4000, stream=True
    )
    it, times, stop = iter(stream), [], threading.Event()
    next(it)

    def read() -> None:
        for _ in it:
            times.append(time.monotonic())
            if stop.is_set():
                return

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A " + long_prompt}], temperature=0, max_tokens=1
    )
    t1 = time.monotonic()
    stop.set()
    reader.join()
    stream.close()
    during = [b - a for a, b in zip(times, times[1:], strict=False) if b >= t0 and a <= t1]
    gone = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "B " + long_prompt}], max_tokens=4, stream=True
    )
    next(iter(gone))
    gone.close()
    t = time.monotonic()
    while _stats(base)["running"] and time.monotonic() - t < 600:
        time.sleep(0.01)
    return {
        "prompt_tokens": r.usage.prompt_tokens,
        "prefill_s": round(t1 - t0, 2),
        "max_stream_gap_s": round(max(during), 3) if during else None,
        "stream_chunks_during_prefill": len(during),
        "freed_after_disconnect_s": round(time.monotonic() - t, 3),
    }


def prefill_workload(store: Path, args) -> dict:
    """`stall_and_cancel` with a 6,000-token prompt, prefilled in chunks (the server's default) and in one
    pass (--prefill-chunk 0); the prefix cache off in both."""
    from transformers import AutoTokenizer

    model_dir = long_context_copy(store)
    long_prompt = _shared_prefix(AutoTokenizer.from_pretrained(model_dir), 6000)
    out = {}
    for label, extra in (("chunked", ()), ("one_pass", ("--prefill-chunk", "0"))):
        with served(store, "--prefix-cache-mib", "0", *extra, ref=str(model_dir)) as (client, base):
            out[label] = stall_and_cancel(client, base, long_prompt)
            log(f"{label}: {out[label]}")
    out["goal"] = {"max_stream_gap_s": 1.0, "freed_after_disconnect_s": 1.0}
    return out


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
        ("--workload", {"choices": ["all", "throughput", "tau2", "prefill"], "default": "all"}),
        ("--conversations", {"type": int, "default": 8}),
        ("--turns", {"type": int, "default": 4}),
        (
            "--prefix-tokens",
            {"type": int, "default": 5000, "help": "Shared system prompt (τ²-like workload)."},
        ),
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
    rows, tau2 = [], None
    if args.workload in ("all", "throughput"):
        with served(store) as (client, _):
            rows = throughput(client, n_req, levels, args.max_tokens)
        print_table(list(rows[0]), [list(r.values()) for r in rows])
    prefill = prefill_workload(store, args) if args.workload in ("all", "prefill") else None
    if args.workload in ("all", "tau2"):
        tau2 = tau2_like(store, args)
        print_table(
            ["tau2-like", "prefill tok/turn", "turn latency s", "wall s"],
            [[k, tau2[k]["mean_prefill_tokens_per_turn"], tau2[k]["mean_turn_latency_s"], tau2[k]["wall_s"]]
             for k in ("cache_on", "cache_off")],
        )  # fmt: skip
        print(f"prefix_cache_speedup: prefill tokens/turn {tau2['prefill_tokens_per_turn_x']}x, "
              f"turn latency {tau2['turn_latency_x']}x, same outputs {tau2['same_outputs']}")  # fmt: skip
    import torch

    result = {
        "benchmark": "serve",
        "command": command(),
        "model": "small preset (trace model init --preset small)",
        "max_tokens": args.max_tokens,
        "build_s": round(build_s, 1),
        "rows": rows,
        "goal": {"concurrency": 16, "x_concurrency_1": 3.0},
        "prefix_cache_speedup": tau2,
        "long_prefill": prefill,
        "machine": machine("torch", torch_threads=torch.get_num_threads(), cuda=torch.cuda.is_available(),
                           OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")),
    }  # fmt: skip
    out = Path(args.out) if args.out else RESULTS / f"serve_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    print(f"wrote {write_result(out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
