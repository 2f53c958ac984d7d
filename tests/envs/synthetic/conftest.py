"""Shared pieces of the sandbox suites: a store to show nothing changes, plain Python run in the jail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trace_cli.envs.sandbox import jail
from trace_cli.store import Store


@pytest.fixture
def store_root(tmp_path):
    """A store with one committed artifact, to show that nothing in it changes."""
    st = Store(tmp_path / "store")
    with st.writer("diagnosis", "diagnose", {"x": 1}, []) as w:
        (w.path / "capabilities.yaml").write_text("kind: diagnosis\n")
    return st.root


@pytest.fixture
def module_env_store(tmp_path):
    """module_env_store(name, source) -> a store (under tmp_path) with one environment artifact `name` whose
    module is `source`."""
    import yaml

    def make(name: str, source: str) -> Path:
        st = Store(tmp_path / "store")
        with st.writer("environment", "synthesize", {name: 1}, [], name=name) as w:
            (w.path / "module.py").write_text(source)
            doc = {
                "kind": "environment",
                "version": 1,
                "name": name,
                "source": "module",
                "module": "module.py",
            }
            (w.path / "environment.yaml").write_text(yaml.safe_dump({**doc, "params": {}, "max_turns": 4}))
        return st.root

    return make


def jail_run(work: Path, probe: str, extra_ro: tuple[str, ...] = (), timeout: int = 120):
    """Plain Python (no child program, no audit hook) in the jail, with `work` as its work directory."""
    work.mkdir(exist_ok=True)
    fd = jail.seccomp_fd()
    try:
        return subprocess.run(
            [*jail.command(str(work), fd, extra_ro), jail.interpreter(), "-I", "-S", "-c", probe],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        os.close(fd)


# what every probe starts with: attempt(name, fn) records in `out` 'ALLOWED' or the exception's type name
PRELUDE = """
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = 'ALLOWED'
    except BaseException as e:
        out[name] = type(e).__name__
"""


@pytest.fixture
def run_in_jail(tmp_path):
    """run_in_jail(probe, extra_ro=()) -> the dict the probe printed (repr) as its last line; the probe may
    use `out` and `attempt` (see PRELUDE)."""

    def run(probe: str, extra_ro: tuple[str, ...] = ()) -> dict:
        work = tmp_path / "work"
        r = jail_run(work, PRELUDE + probe, extra_ro)
        assert r.returncode == 0, r.stderr[-3000:]
        assert list(work.iterdir()) == []  # the work tmpfs lives inside the jail only
        return eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's repr of a dict

    return run
