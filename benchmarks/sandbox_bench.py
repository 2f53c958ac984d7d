#!/usr/bin/env python
"""Sandbox bounds under attack (issues 35 and 46): what a hostile module's or endpoint's answers, files and
silences cost the CLI.

1. A 60 MB answer (a task_metadata() of 60 MB) and a 64 MB answer without a newline (raw bytes on the
   protocol pipe): wall time until the worker refuses it, the parent's CPU and the parent's peak RSS
   (each case in a fresh process, so the peak is that case's).
2. 400,000 empty files in one call: how many the work tmpfs takes before ENOSPC, and how long that takes.
3. Hangs (issue 46): a module that stops reading its requests, sent a 200 KB request (the call's deadline
   is 5 s here); `trace eval` stuck on such a module, then Ctrl-C (SIGINT) or SIGTERM: seconds from the
   signal to the exit, and whether the sandbox directory is left; an OpenAI-compatible endpoint that
   trickles a byte every 0.5 s (deadline 5 s).
4. Volume (issue 46): `trace eval` of 16 seeds on a module answering 3.9 MB per step (the episode's budget is
   8 MB: refused at the third step) — wall, the CLI's peak RSS, what the store grew by; an endpoint that
   sends a 400 MB answer (cap: the default 32 MB) — wall and peak RSS.
5. The per-call cost of the protocol (ping: thaw, request, answer, thread check, freeze; median of 200) and
   the start of a worker.

Goals: answers refused in < 2 s at < 200 MB parent RSS; files bounded by the tmpfs's inode count; every hang
ended by its deadline or at once by a signal, no sandbox directory left; volume refused at a bounded peak.
A case that does not end within 300 s is reported as such (the process is killed).

    python benchmarks/sandbox_bench.py
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import RESULTS, machine, print_table, write_result

BIG = """
def make_env(**params):
    from trace_cli.envs.synthetic import TEMPLATES
    env = TEMPLATES['precondition_verification'](**params)
    env.task_metadata = lambda: {'answer_values': ['x' * (60 << 20)]}
    return env
"""
RAW = """
import os
def make_env(**params):
    for fd in range(3, 12):
        try:
            os.write(fd, b'x' * (64 << 20))
        except OSError:
            pass
"""
FILES = """
def make_env(**params):
    n = 0
    try:
        for n in range(400000):
            open(f'f{n}', 'w').close()
    except OSError as e:
        raise RuntimeError(f'{n} files, then errno {e.errno}')
    raise RuntimeError(f'{n + 1} files, no error')
"""


def _case(name: str) -> dict:
    """One case, run in this (fresh) process."""
    from trace_cli.envs.sandbox import Limits, SandboxError, SandboxViolation, SandboxWorker

    src = {"60 MB answer": BIG, "64 MB without a newline": RAW, "400,000 files": FILES}[name]
    with SandboxWorker(src, Limits(memory_mb=2048, timeout_s=120, cpu_s=60)) as w:
        handle = w.call("new", params={})["handle"] if name.startswith("60") else None
        t0, c0 = time.monotonic(), time.process_time()
        try:
            w.call("task_metadata", handle=handle) if handle else w.call("new", params={})
            outcome = "accepted"
        except (SandboxViolation, SandboxError) as e:
            outcome = e.reason
        return {
            "case": name,
            "wall_s": round(time.monotonic() - t0, 3),
            "parent_cpu_s": round(time.process_time() - c0, 3),
            "parent_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "outcome": outcome[:120],
        }


STOPS_READING = """
import os
_KEEP = []
def make_env(**params):
    from trace_cli.envs.synthetic import TEMPLATES
    env = TEMPLATES['precondition_verification'](**params)
    def reference_actions():
        if not _KEEP:
            r, w = os.pipe()
            _KEEP.append((os.dup(0), r, w))
            os.dup2(r, 0)
        return [{"name": "lookup", "arguments": {"blob": "x" * 200_000}}]
    env.reference_actions = reference_actions
    return env
"""
FLOODS = """
import dataclasses
def make_env(**params):
    from trace_cli.envs.synthetic import TEMPLATES
    env = TEMPLATES['precondition_verification'](**params)
    real_step = env.step
    def step(action):
        r = real_step(action)
        return dataclasses.replace(r, observation=r.observation + "x" * 3_900_000, done=False)
    env.step = step
    env.reference_actions = lambda: [{"name": "lookup", "arguments": {"k": i}} for i in range(8)]
    return env
"""
HANG_CASES = ("module stops reading", "eval stuck, SIGINT", "eval stuck, SIGTERM", "endpoint trickles")
VOLUME_CASES = ("eval, 3.9 MB per step", "endpoint, 400 MB answer")


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _module_store(root: Path, name: str, source: str) -> Path:
    import yaml

    from trace_cli.store import Store

    st = Store(root)
    with st.writer("environment", "synthesize", {name: 1}, [], name=name) as w:
        (w.path / "module.py").write_text(source)
        doc = {"kind": "environment", "version": 1, "name": name, "source": "module", "module": "module.py"}
        (w.path / "environment.yaml").write_text(yaml.safe_dump({**doc, "params": {}, "max_turns": 4}))
    return st.root


def _trace() -> list[str]:
    exe = Path(sys.executable).parent / "trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]


def _du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _eval_case(name: str) -> dict:
    """`trace eval ... --model policy:reference` on a hostile module, in a child process (its own TMPDIR)."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tmp = d / "tmp"
        tmp.mkdir()
        volume = name.startswith("eval, 3.9")
        store = _module_store(d / "store", "hostile", FLOODS if volume else STOPS_READING)
        before = _du(store)
        env = dict(os.environ, TMPDIR=str(tmp), TRACE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
        env.pop("TRACE_STORE", None)
        seeds = "0:16" if volume else "0:1"
        cmd = [*_trace(), "eval", "--env", "store://environment/hostile", "--model", "policy:reference"]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "--seeds", seeds, "--store", str(store)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        signalled = None
        if not volume:  # wait until the run is stuck writing the large request, then signal it
            while not list(tmp.glob("trace-sandbox-*")) and proc.poll() is None:
                time.sleep(0.05)
            time.sleep(4)
            sig = signal.SIGINT if name.endswith("SIGINT") else signal.SIGTERM
            signalled = time.monotonic()
            proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=280)
            outcome = (err.strip().splitlines() or ["(no message)"])[-1]
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            outcome = "did not end within 280 s (killed)"
        end = time.monotonic()
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {
            "case": name,
            "wall_s": round(end - (signalled or t0), 3),
            "exit": proc.returncode,
            "cli_peak_rss_mb": round(peak, 1),
            "store_growth_mb": round((_du(store) - before) / 1e6, 2),
            "sandbox_dirs_left": len(list(tmp.glob("trace-sandbox-*"))),
            "outcome": outcome[:160],
        }


class _Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        trickle = self.path.startswith("/trickle")
        size = 1 << 20 if trickle else 400 << 20
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        try:
            if trickle:
                for _ in range(size):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.5)
            else:
                chunk = b" " * (1 << 20)
                for _ in range(400):
                    self.wfile.write(chunk)
        except OSError:
            return


def _endpoint_case(name: str) -> dict:
    """An OpenAI-compatible endpoint that trickles or floods, asked through the eval policy's client."""
    from types import SimpleNamespace

    from trace_cli.agents.openai_policy import OpenAIPolicy
    from trace_cli.errors import TraceError
    from trace_cli.llm.openai_client import parse_ref

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    path = "trickle" if "trickle" in name else "flood"
    extra = "&deadline=5" if path == "trickle" else ""
    ep = parse_ref(f"openai:http://127.0.0.1:{srv.server_address[1]}/{path}/v1?model=m&timeout=5{extra}")
    policy = OpenAIPolicy(ep, temperature=0.0, top_p=1.0, max_new_tokens=8, seed=0)
    t0, c0 = time.monotonic(), time.process_time()
    try:
        policy._request(SimpleNamespace(messages=[{"role": "user", "content": "hi"}], tools=[]))
        outcome = "accepted"
    except TraceError as e:
        outcome = str(e)
    return {
        "case": name,
        "wall_s": round(time.monotonic() - t0, 3),
        "parent_cpu_s": round(time.process_time() - c0, 3),
        "parent_peak_rss_mb": _peak_mb(),
        "outcome": outcome[:160],
    }


def _stops_reading() -> dict:
    from trace_cli.envs.sandbox import Limits, SandboxedEnv, SandboxError, SandboxViolation, SandboxWorker

    with SandboxWorker(STOPS_READING, Limits(memory_mb=1024, timeout_s=5, cpu_s=5)) as w:
        env = SandboxedEnv(w)
        env.reset(0)
        env.reference_actions()
        t0, c0 = time.monotonic(), time.process_time()
        try:
            env.step({"name": "lookup", "arguments": {"blob": "x" * 200_000}})
            outcome = "accepted"
        except (SandboxViolation, SandboxError) as e:
            outcome = e.reason
        return {
            "case": "module stops reading",
            "wall_s": round(time.monotonic() - t0, 3),
            "parent_cpu_s": round(time.process_time() - c0, 3),
            "parent_peak_rss_mb": _peak_mb(),
            "outcome": outcome[:160],
        }


def _calls() -> dict:
    from trace_cli.envs.sandbox import SandboxWorker

    t0 = time.monotonic()
    with SandboxWorker("def make_env(**params):\n    pass\n") as w:
        start = time.monotonic() - t0
        times = []
        for _ in range(200):
            t = time.perf_counter()
            w.call("ping")
            times.append(time.perf_counter() - t)
    return {"worker_start_s": round(start, 3), "ping_median_ms": round(statistics.median(times) * 1e3, 2)}


def _run_case(name: str) -> dict:
    """One case in a fresh process (its peak RSS is that case's); a case that hangs is killed and said so."""
    try:
        r = subprocess.run(
            [sys.executable, __file__, "--case", name],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return {"case": name, "wall_s": None, "outcome": "did not end within 300 s (killed)"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        name = sys.argv[2]
        if name == "calls":
            out = _calls()
        elif name == "module stops reading":
            out = _stops_reading()
        elif name.startswith("eval"):
            out = _eval_case(name)
        elif name.startswith("endpoint"):
            out = _endpoint_case(name)
        else:
            out = _case(name)
        print(json.dumps(out))
        return
    names = ("60 MB answer", "64 MB without a newline", "400,000 files")
    cases = [_run_case(n) for n in names]
    hangs = [_run_case(n) for n in HANG_CASES]
    volume = [_run_case(n) for n in VOLUME_CASES]
    calls = _run_case("calls")
    print_table(
        ["case", "wall s", "parent CPU s", "parent peak RSS MB", "outcome"],
        [
            [c["case"], c["wall_s"], c.get("parent_cpu_s"), c.get("parent_peak_rss_mb"), c["outcome"]]
            for c in cases
        ],
    )
    print()
    print_table(
        ["hang / volume", "wall s", "exit", "peak RSS MB", "store +MB", "sandbox dirs left", "outcome"],
        [
            [
                c["case"],
                c["wall_s"],
                c.get("exit"),
                c.get("cli_peak_rss_mb", c.get("parent_peak_rss_mb")),
                c.get("store_growth_mb"),
                c.get("sandbox_dirs_left"),
                c["outcome"],
            ]
            for c in hangs + volume
        ],
    )
    print(f"worker start {calls['worker_start_s']} s; ping median {calls['ping_median_ms']} ms")
    doc = {"machine": machine(), "cases": cases, "hangs": hangs, "volume": volume, **calls}
    print(write_result(RESULTS / "sandbox_bench.json", doc))


if __name__ == "__main__":
    main()
