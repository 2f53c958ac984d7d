"""The subprocess sandbox for LLM-written environment modules: good modules pass the template checks; modules
that loop forever, allocate without bound, open a socket or write outside their directory are stopped and
rejected with a clear reason, and the store is left exactly as it was."""

from __future__ import annotations

import textwrap

import pytest
from trace_testing import snapshot

from trace_cli.agents.scripted import ReferencePolicy
from trace_cli.envs.rollout import rollout
from trace_cli.envs.sandbox import Limits, SandboxedEnv, SandboxViolation, SandboxWorker, check_module

GOOD = textwrap.dedent('''
    """A module env built on the shared template base (what an LLM author is shown how to write)."""
    from trace_cli.envs.synthetic import TEMPLATES

    def make_env(**params):
        return TEMPLATES["precondition_verification"](**params)
''')

FAST = Limits(cpu_s=1.0, timeout_s=20.0, memory_mb=512)
# check_module takes its seed counts from the synthesize config's `checks`; these are what these tests ran with
SEEDS = {"reference_seeds": 100, "determinism_seeds": 10, "do_nothing_seeds": 50, "leakage_seeds": 50}


pytestmark = pytest.mark.needs_sandbox


def _bad(body: str) -> str:
    """A module that misbehaves when the environment is created (after a normal import)."""
    return "import os\nimport sys\n\ndef make_env(**params):\n" + textwrap.indent(
        textwrap.dedent(body), "    "
    )


def test_limits_come_from_the_sandbox_block_and_the_schema_fills_the_rest():
    """A worker's limits are synthesize's `sandbox` block; keys it lacks, or all of them where no config gives
    any (a stored environment's worker), are synthesize.v1.json's defaults."""
    from trace_cli.config.schemas import load_schema

    props = load_schema("config/synthesize.v1.json")["properties"]["sandbox"]["properties"]
    timeout = float(props["timeout_s"]["default"])
    assert Limits.of({"cpu_s": 3, "memory_mb": 512}) == Limits(cpu_s=3.0, memory_mb=512, timeout_s=timeout)
    assert Limits.of() == Limits(cpu_s=10.0, memory_mb=1024, timeout_s=30.0)  # what Limits() was
    with SandboxWorker(GOOD) as w:
        assert w.limits == Limits.of()


def test_good_module_passes_the_template_checks():
    v = check_module(
        GOOD,
        {"level": 1},
        FAST,
        reference_seeds=100,
        determinism_seeds=5,
        do_nothing_seeds=30,
        leakage_seeds=30,
    )
    assert v.accepted, v.reason
    assert {c["name"] for c in v.checks} == {"determinism", "reference", "do_nothing", "leakage"}
    assert v.network_isolation == "bwrap"


def test_sandboxed_env_runs_in_the_rollout_loop():
    with SandboxWorker(GOOD, FAST) as w:
        res = rollout(
            ReferencePolicy(), lambda: SandboxedEnv(w, {"level": 2}), [(s, 0) for s in range(6)], max_turns=12
        )
    assert all(r.success and r.reward == 1.0 for r in res)
    assert res[0].env == "synthetic-precondition_verification"


@pytest.mark.parametrize(
    "case,body,reason",
    [
        ("infinite loop", "while True:\n    pass\n", "CPU time limit exceeded"),
        (
            "unbounded allocation",
            "x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))\n",
            "memory limit exceeded",
        ),
        (
            "socket",
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', 80))\n",
            "network access is not allowed",
        ),
        (
            "write outside",
            "open(os.environ.get('EVIL') or '{evil}', 'w').write('x')\n",
            "writing outside the sandbox directory is not allowed",
        ),
        (
            "delete outside",
            "os.remove('{manifest}')\n",
            "changing files outside the sandbox directory is not allowed",
        ),
        (
            "write caught",
            "try:\n    open('{evil}', 'w').write('x')\nexcept Exception:\n    pass\n"
            "from trace_cli.envs.synthetic import TEMPLATES\nreturn TEMPLATES['precondition_verification']()\n",
            "writing outside the sandbox directory is not allowed",
        ),
    ],
)
def test_misbehaving_modules_are_stopped_and_rejected(store_root, case, body, reason):
    manifest = next(store_root.glob("diagnosis/*/manifest.yaml"))
    evil = store_root / "evil.txt"
    before = snapshot(store_root)
    src = _bad(body.format(evil=evil, manifest=manifest))
    v = check_module(src, {}, FAST, **SEEDS)
    assert not v.accepted
    assert reason in v.reason, v.reason
    assert snapshot(store_root) == before  # nothing written, removed or touched
    assert not evil.exists() and manifest.exists()


def test_wall_clock_timeout_and_crash_reasons():
    slow = _bad("import time\ntime.sleep(60)\n")
    v = check_module(slow, {}, Limits(cpu_s=5, timeout_s=1.5, memory_mb=1024), **SEEDS)
    assert not v.accepted and v.reason.startswith("timed out") and "new()" in v.reason
    v = check_module(_bad("os._exit(3)\n"), {}, FAST, **SEEDS)
    assert not v.accepted and "exit code 3" in v.reason
    v = check_module(_bad("raise ValueError('broken')\n"), {}, FAST, **SEEDS)
    assert not v.accepted and "ValueError" in v.reason and "broken" in v.reason
    v = check_module("def make_env(:\n", {}, FAST, **SEEDS)
    assert not v.accepted and "does not compile" in v.reason
    v = check_module(_bad("import subprocess\n"), {}, FAST, **SEEDS)
    assert not v.accepted and "not allowed" in v.reason
    v = check_module(_bad("open('/etc/hostname').read()\n"), {}, FAST, **SEEDS)
    assert not v.accepted and "reading outside the sandbox" in v.reason


def test_a_module_that_fails_a_check_is_rejected_with_the_check():
    lazy = GOOD + textwrap.dedent("""
        _make = make_env
        def make_env(**params):
            env = _make(**params)
            env.reference_actions = lambda: [{"content": "Goodbye."}]
            return env
    """)
    v = check_module(lazy, {}, FAST, **SEEDS)
    assert not v.accepted and v.reason.startswith("check reference failed")


def test_a_dead_worker_stays_dead():
    with SandboxWorker(_bad("while True:\n    pass\n"), Limits(cpu_s=0.5, timeout_s=10, memory_mb=1024)) as w:
        with pytest.raises(SandboxViolation, match="CPU time limit"):
            SandboxedEnv(w)
        with pytest.raises(SandboxViolation, match="CPU time limit"):
            w.call("ping")
