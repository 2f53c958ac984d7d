"""Shared fixtures: the real τ²-bench data, tmp stores, a quiet environment."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from functools import cache
from pathlib import Path

import pytest

# Helper modules in tests/ (trace_testing, fixture_stages) import as top-level modules.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from trace_testing import TAU2_DIR, TAU2_FILES  # noqa: E402

# A run started in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler; the Ctrl-C tests need it, here and in the CLIs they start
# (exec resets a caught signal to its default, while an ignored one stays ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    monkeypatch.setenv("TRACE_NO_PROGRESS", "1")
    monkeypatch.delenv("TRACE_STORE", raising=False)
    monkeypatch.delenv("TRACE_VERBOSE", raising=False)
    yield
    # a test that ran the CLI in-process into its Ctrl-C path aborted every LLM answer of this process
    # (llm.openai_client.abort: right for a CLI about to exit); the next test starts unaborted
    llm = sys.modules.get("trace_cli.llm.openai_client")
    if llm is not None:
        llm.clear_abort()


@pytest.fixture(scope="session")
def tau2_dir() -> Path:
    missing = [f for f in TAU2_FILES.values() if not (TAU2_DIR / f).is_file()]
    assert not missing, f"vendored τ²-bench data missing from {TAU2_DIR}: {missing}"
    return TAU2_DIR


@pytest.fixture
def store(tmp_path) -> Path:
    """A store directory that does not exist yet."""
    return tmp_path / "store"


# --- the OS sandbox (bubblewrap) --------------------------------------------------------------------------------
# Tests marked `needs_sandbox` run untrusted modules in the real jail. Where it cannot exist (no bubblewrap, or no
# namespaces in this container) they are skipped with the reason, and the run ends with one line that says how many
# and how to get the sandbox; TRACE_REQUIRE_SANDBOX=1 (CI) makes them run and fail instead, so a CI machine that
# lost bubblewrap cannot pass by skipping.
REQUIRE_SANDBOX = "TRACE_REQUIRE_SANDBOX"


@cache
def sandbox_missing() -> str:
    """Why the OS sandbox cannot run here, or "" when it can."""
    from trace_cli.envs.sandbox import jail

    if jail.available():
        return ""
    if shutil.which("bwrap") is None:
        return (
            "no OS sandbox: bubblewrap is not installed (make sandbox as root, or apt-get install bubblewrap)"
        )
    return "no OS sandbox: bubblewrap cannot create namespaces in this container"


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("needs_sandbox")]
    if not marked or os.environ.get(REQUIRE_SANDBOX, "") not in ("", "0") or not sandbox_missing():
        return
    skip = pytest.mark.skip(reason=sandbox_missing())
    for item in marked:
        item.add_marker(skip)
    config.stash[_SKIPPED_SANDBOX] = len(marked)


_SKIPPED_SANDBOX = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.stash.get(_SKIPPED_SANDBOX, 0)
    if n:
        terminalreporter.write_line(f"{n} sandbox tests skipped: {sandbox_missing()}", yellow=True, bold=True)
