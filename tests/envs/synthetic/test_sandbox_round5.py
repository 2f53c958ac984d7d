"""Sandbox round 5 (issue 46): every wait on the module has a wall-clock deadline (a module that stops reading
its requests cannot hang a run), Ctrl-C and SIGTERM end a run promptly and remove its sandbox directory, a
run's answers have a budget, a masked standard-library module says the sandbox does not offer it, and the
module's own text never reaches the terminal raw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from trace_testing import run_trace

from trace_cli.envs.sandbox import Limits, SandboxedEnv, SandboxViolation, SandboxWorker, check_module

pytestmark = pytest.mark.needs_sandbox

FAST = Limits(cpu_s=2.0, timeout_s=5.0, memory_mb=512)

# The module swaps the child's request pipe for a pipe of its own (keeping the real one open, so writes to it
# do not fail): the child's loop then never reads another request, and a request larger than the pipe
# buffer (64 KB) blocks its writer. Its reference actions are large, as `policy:reference` replays them.
STOPS_READING = """
from trace_cli.envs.synthetic import TEMPLATES
import os

_KEEP = []


def make_env(**params):
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


def _in_thread(fn):
    """Run fn() on a daemon thread; (finished, result or exception). A hang leaves the thread behind (daemon:
    it does not keep the test process alive) and reports finished=False after 90 s."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(90)
    return not t.is_alive(), box.get("result")


def test_a_module_that_stops_reading_its_requests_cannot_hang_a_call():
    w = SandboxWorker(STOPS_READING, FAST)
    try:
        env = SandboxedEnv(w)
        env.reset(0)
        env.reference_actions()  # from now on the module reads no request

        def big_step():
            return env.step({"name": "lookup", "arguments": {"blob": "x" * 200_000}})

        finished, result = _in_thread(big_step)
        assert finished, "the call hung: the request was written without a deadline"
        assert isinstance(result, SandboxViolation), result
        assert "does not read its requests" in result.reason and "step()" in result.reason, result.reason
    finally:
        w.close()


def test_trace_eval_on_a_module_that_stops_reading_ends_with_a_clear_violation(module_env_store):
    store = module_env_store("stops-reading", STOPS_READING)
    r = run_trace(
        "eval",
        "--env",
        "store://environment/stops-reading",
        "--model",
        "policy:reference",
        "--seeds",
        "0:1",
        "--store",
        store,
        timeout=240,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "does not read its requests" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


def _trace_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_ends_a_stuck_run_promptly_and_removes_its_sandbox(module_env_store, tmp_path, sig):
    """The run is stuck writing a request the module never reads (the per-call deadline is 30 s): Ctrl-C
    (SIGINT) or SIGTERM ends it at once, with exit 130 or as killed by SIGTERM, and its sandbox directory is
    gone."""
    store = module_env_store("stops-reading", STOPS_READING)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), TRACE_NO_PROGRESS="1")
    env.pop("TRACE_STORE", None)
    proc = subprocess.Popen(
        [*_trace_cmd(), "eval", "--env", "store://environment/stops-reading", "--model", "policy:reference"]
        + ["--seeds", "0:1", "--store", str(store)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 120
        while not list(tmp.glob("trace-sandbox-*")) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        assert list(tmp.glob("trace-sandbox-*")), "no sandbox started"
        time.sleep(4)  # reset() done, the large step() request being written
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{signal.Signals(sig).name} did not end the run")
        err = err.decode("utf-8", "replace")
        assert proc.returncode in ((130,) if sig == signal.SIGINT else (143, -signal.SIGTERM)), (
            proc.returncode,
            err,
        )
        assert "internal error" not in err, err
        assert not list(tmp.glob("trace-sandbox-*")), "the sandbox directory was left behind"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


MASKED = """
from trace_cli.envs.synthetic import TEMPLATES


def make_env(**params):
    import sqlite3  # noqa: F401
    return TEMPLATES['precondition_verification'](**params)
"""


def test_a_masked_standard_library_module_says_the_sandbox_does_not_offer_it():
    v = check_module(
        MASKED, {}, FAST, reference_seeds=1, determinism_seeds=1, do_nothing_seeds=1, leakage_seeds=1
    )
    assert not v.accepted
    assert "the sandbox does not offer" in v.reason, v.reason
    assert "_sqlite3" in v.reason, v.reason


ESCAPES = """
from trace_cli.envs.synthetic import TEMPLATES


def make_env(**params):
    raise ValueError("\\x1b]0;pwned\\x07\\x1b]52;c;ZWNobyBoaQ==\\x07\\rall good")
"""


def test_a_modules_error_text_reaches_the_terminal_escaped(module_env_store):
    store = module_env_store("loud", textwrap.dedent(ESCAPES))
    r = run_trace(
        "eval",
        "--env",
        "store://environment/loud",
        "--model",
        "policy:reference",
        "--seeds",
        "0:1",
        "--store",
        store,
    )
    assert r.returncode != 0
    assert "pwned" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr + r.stdout and "\r" not in r.stderr + r.stdout
    assert "\\x1b]0;pwned" in r.stderr


# A module whose every step answers just under the per-call cap (4 MB): the episode's answers add up past its
# budget (8 MB) at the third step, which the per-call bound alone never refused.
FLOODS = """
import dataclasses
from trace_cli.envs.synthetic import TEMPLATES


def make_env(**params):
    env = TEMPLATES['precondition_verification'](**params)
    real_step = env.step

    def step(action):
        r = real_step(action)
        return dataclasses.replace(r, observation=r.observation + "x" * 3_900_000, done=False)

    env.step = step
    env.reference_actions = lambda: [{"name": "lookup", "arguments": {"k": i}} for i in range(8)]
    return env
"""


def test_a_run_whose_answers_exceed_the_episode_budget_is_refused(module_env_store):
    store = module_env_store("floods", FLOODS)
    r = run_trace(
        "eval",
        "--env",
        "store://environment/floods",
        "--model",
        "policy:reference",
        "--seeds",
        "0:2",
        "--store",
        store,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "exceed an episode's budget (8 MB" in r.stderr, r.stderr
    assert "internal error" not in r.stderr
    assert not list((store / "eval").glob("*/manifest.yaml")) if (store / "eval").is_dir() else True
