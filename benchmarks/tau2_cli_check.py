#!/usr/bin/env python
"""τ²-bench's own CLI against `trace serve`, with the command `trace serve --help` prints (issue 34).

1. Imports SmolLM2-135M-Instruct (`trace model import smollm2-135m-instruct`) into a temp store (or reuses
   --store); --model names another model artifact.
2. Runs the τ²-bench block of `trace serve --help` (trace_cli.cli.serve.TAU2) as written, AGENT and USER
   replaced by the model's name: two `trace serve` processes (agent on 8000, user simulator on 8001, by
   default; --ports to change) with TRACE_SERVE_API_KEY/OPENAI_API_KEY set, then `tau2 run ...` through bash,
   once per --domains entry with `--domain` set to it and `--num-tasks`, `--max-steps` and `--save-to`
   appended (a few short tasks).
3. Reads each results.json back with `trace ingest tau2` and records per domain: wall time, tau2's exit
   status, simulations written, and the episodes the ingest wrote.
4. Prints a table and writes JSON (default benchmarks/results/tau2_cli_check.json).

τ²-bench is not a dependency of this project: install it in its own virtual environment and pass its `tau2`
executable with --tau2 (or have `tau2` on PATH). Without it the check skips with a message (exit 0).
The check needs τ²-bench's CLI with `tau2 run --agent-llm-args` (v1.0.1 of sierra-research/tau2-bench,
installed from its repository; the PyPI package named `tau2` is an unrelated project).

    python benchmarks/tau2_cli_check.py --tau2 /path/to/venv/bin/tau2 --domains mock retail --num-tasks 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import RESULTS, command, log, machine, print_table, write_result
from serve_bench import _stop

BIN = Path(sys.executable).parent
KEY = "secret"


def _trace(*args: str, store: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACE_NO_PROGRESS": "1"}
    cmd = [str(BIN / "trace"), *args, "--store", str(store)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def _ready(port: int, proc: subprocess.Popen, log_path: Path) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"}
    )
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"trace serve exited: {log_path.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(req, timeout=5):
                return
        time.sleep(0.25)
    raise RuntimeError(f"trace serve on {port} did not answer")


def help_block(name: str, ports: tuple[int, int]) -> tuple[list[str], str]:
    """The serve commands and the `tau2 run` command of `trace serve --help`, AGENT/USER = name."""
    from trace_cli.cli.serve import TAU2

    text = TAU2.replace("AGENT", name).replace("USER", name)
    text = text.replace(":8000", f":{ports[0]}").replace(":8001", f":{ports[1]}")
    text = text.replace("--port 8000", f"--port {ports[0]}").replace("--port 8001", f"--port {ports[1]}")
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    serves = [ln.rstrip("&").strip() for ln in lines if ln.startswith("trace serve")]
    run = next(ln for ln in lines if ln.startswith("tau2 run"))
    return serves, re.sub(r"\s+", " ", run)


@contextlib.contextmanager
def servers(serves: list[str], store: Path, workdir: Path):
    """The help's `trace serve` lines, each started with the key in the environment; stopped on exit."""
    procs = []
    env = {**os.environ, "TRACE_SERVE_API_KEY": KEY, "OPENAI_API_KEY": KEY, "TRACE_NO_PROGRESS": "1"}
    try:
        for i, line in enumerate(serves):
            args = line.split()[2:]
            log_path = workdir / f"serve-{i}.log"
            with log_path.open("w") as err:
                cmd = [str(BIN / "trace"), "serve", *args, "--store", str(store)]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
            _ready(int(args[args.index("--port") + 1]), procs[-1], log_path)
        yield
    finally:
        for p in procs:
            _stop(p)


def _data_dir(tau2: Path) -> Path:
    """Where this τ²-bench writes simulations (its DATA_DIR), asked of its own interpreter."""
    code = "from tau2.utils.utils import DATA_DIR; print(DATA_DIR)"
    out = subprocess.run(
        [str(tau2.parent / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def run_domain(run: str, domain: str, args, store: Path, tau2: Path, workdir: Path) -> dict:
    tag = f"trace-check-{domain}-{int(time.time())}"
    cmd = run.replace("--domain retail", f"--domain {domain}")
    cmd += f" --num-tasks {args.num_tasks} --max-steps {args.max_steps} --save-to {tag}"
    env = {**os.environ, "OPENAI_API_KEY": KEY, "PATH": f"{tau2.parent}:{os.environ.get('PATH', '')}"}
    log(f"{domain}: {cmd}")
    t = time.perf_counter()
    with (workdir / f"tau2-{domain}.log").open("w") as out:
        rc = subprocess.run(["bash", "-c", cmd], env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t
    found = sorted(_data_dir(tau2).joinpath("simulations").glob(f"{tag}*/results.json"))
    found += sorted(_data_dir(tau2).joinpath("simulations").glob(f"{tag}*.json"))
    row = {"domain": domain, "command": cmd, "rc": rc, "wall_s": round(wall, 1), "results": None}
    row.update({"simulations": 0, "rewards": [], "ingested": None, "ingest_error": None})
    if found:
        res = found[0]
        doc = json.loads(res.read_text())
        row["results"] = str(res)
        row["simulations"] = len(doc.get("simulations", []))
        row["rewards"] = [(s.get("reward_info") or {}).get("reward") for s in doc.get("simulations", [])]
        ing = _trace("ingest", "tau2", str(res), "--name", tag, "--on-error", "skip", store=store)
        if ing.returncode == 0:
            row["ingested"] = _episodes(store, tag)
        else:
            row["ingest_error"] = (ing.stderr or ing.stdout)[-500:]
    return row


def _episodes(store: Path, name: str) -> dict:
    """The summary of the rollouts artifact the ingest wrote."""
    from trace_cli.store import Store

    return Store(store).resolve(f"store://rollouts/{name}").summary


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tau2", help="τ²-bench's `tau2` executable (default: `tau2` on PATH).")
    ap.add_argument("--store", help="Reuse this store.")
    ap.add_argument("--model", help="A model artifact name in --store (default: import SmolLM2-135M).")
    ap.add_argument("--domains", nargs="+", default=["mock", "retail"])
    ap.add_argument("--num-tasks", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--ports", type=int, nargs=2, default=[8000, 8001])
    ap.add_argument("--out", default=str(RESULTS / "tau2_cli_check.json"))
    return ap.parse_args()


def main() -> int:
    args = _args()
    tau2 = Path(args.tau2) if args.tau2 else (Path(w) if (w := shutil.which("tau2")) else None)
    if tau2 is None or not tau2.exists():
        print("skipped: τ²-bench's `tau2` not found (install it in its own venv and pass --tau2 PATH)")
        return 0
    store = Path(args.store or tempfile.mkdtemp(prefix="tau2-check-") + "/store")
    name = args.model or "smollm2"
    if not args.model:
        imp = _trace("model", "import", "smollm2-135m-instruct", "--name", name, store=store)
        if imp.returncode != 0:
            print(f"skipped: SmolLM2 import failed: {(imp.stderr or imp.stdout)[-300:]}")
            return 0
    serves, run = help_block(name, tuple(args.ports))
    workdir = Path(tempfile.mkdtemp(prefix="tau2-check-logs-"))
    with servers(serves, store, workdir):
        rows = [run_domain(run, d, args, store, tau2, workdir) for d in args.domains]
    print_table(
        ["domain", "rc", "wall s", "simulations", "rewards", "ingested"],
        [
            [r["domain"], r["rc"], r["wall_s"], r["simulations"], r["rewards"], bool(r["ingested"])]
            for r in rows
        ],
    )
    doc = {"command": command(), "serve": serves, "tau2_run": run, "rows": rows, "logs": str(workdir)}
    doc["machine"] = machine("torch")
    print(f"wrote {write_result(args.out, doc)}")
    return 0 if all(r["rc"] == 0 and r["ingested"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
