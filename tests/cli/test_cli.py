"""The `trace` CLI skeleton: help and examples, --version, lazy imports, -v, exit codes, --store default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from trace_testing import BIN, episode, run_cli, run_trace, write_jsonl

import trace_cli
from trace_cli.cli import COMMANDS, _available, cli

HEAVY = ("torch", "transformers", "trl", "peft", "accelerate")


def _walk(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, click.Context(cmd, info_name=name, parent=ctx), (*path, name))


def _all_commands():
    with click.Context(cli, info_name="trace") as ctx:
        return [p for p, _ in _walk(cli, ctx)]


def test_help_lists_every_command_with_its_summary():
    r = run_trace("--help")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    available = _available()
    for required in ("ingest", "run", "status", "validate", "store"):
        assert required in available
    for name in available:
        summary = " ".join(COMMANDS[name][2].split())
        assert f"{name} {summary}" in flat, name
    assert "Example" in r.stdout and "--store DIR" in flat


def test_every_registered_command_exists():
    """A command listed in COMMANDS whose module is missing would be hidden from --help silently."""
    assert _available() == list(COMMANDS)


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p))
def test_every_command_has_help_with_an_example(path):
    r = run_cli(*path, "--help")
    assert r.exit_code == 0, r.output
    assert "Example" in r.stdout, f"`trace {' '.join(path)} --help` has no example"
    assert "Usage: trace " + " ".join(path) in r.stdout


def test_store_option_on_every_store_command():
    for path in [
        ("ingest", "tau2"),
        ("ingest", "jsonl"),
        ("run",),
        ("status",),
        ("store", "ls"),
        ("store", "show"),
        ("store", "sql"),
        ("store", "reindex"),
        ("store", "verify"),
        ("store", "gc"),
    ]:
        r = run_cli(*path, "--help")
        assert "--store DIRECTORY" in r.stdout and "$TRACE_STORE" in r.stdout, path


def test_version():
    r = run_trace("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"trace, version {trace_cli.__version__}"


def test_help_does_not_import_heavy_libraries():
    code = (
        f"HEAVY = {HEAVY!r}\n"
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "from trace_cli.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY)\n"
        "print('HEAVY', ','.join(heavy), file=sys.stderr)\n"
        "print('SECONDS', time.perf_counter() - t, file=sys.stderr)\n"
    )
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    for args in (
        ["--help"],
        ["store", "--help"],
        ["ingest", "tau2", "--help"],
        ["run", "--help"],
        ["validate", "--help"],
    ):
        r = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert r.returncode == 0, r.stderr
        heavy = next(line for line in r.stderr.splitlines() if line.startswith("HEAVY"))
        assert heavy == "HEAVY ", f"`trace {' '.join(args)}` imported {heavy[6:]}"
    # the console script itself, timed the way a user sees it (printed, not asserted: timings vary by machine)
    t = time.perf_counter()
    r = run_trace("--help")
    wall = time.perf_counter() - t
    assert r.returncode == 0
    imp = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trace_cli", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert imp.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in imp.stderr.splitlines() if "|" in line}
    assert not imported & set(HEAVY), imported & set(HEAVY)
    print(f"`trace --help` wall time: {wall:.3f}s")


def test_errors_are_one_line_and_verbose_shows_the_traceback(tmp_path):
    store = tmp_path / "store"
    r = run_cli("store", "show", "nothing", "--store", store)
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"error: no artifact named or with id 'nothing' in store {store} (see `trace store ls`)"
    ]
    for args in (["-v", "store", "show", "nothing"], ["store", "show", "nothing", "-v"]):
        r = run_cli(*args, "--store", store)
        assert r.exit_code == 2
        assert "Traceback (most recent call last)" in r.stderr and "NotFoundError" in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("error: no artifact named")
    # -v does not stick to later invocations in the same process
    r = run_cli("store", "show", "nothing", "--store", store)
    assert "Traceback" not in r.stderr
    r = run_cli("store", "show", "nothing", "--store", store, env={"TRACE_VERBOSE": "1"})
    assert "Traceback" in r.stderr
    # a real subprocess behaves the same
    p = run_trace("-v", "store", "show", "nothing", "--store", store)
    assert p.returncode == 2 and "Traceback" in p.stderr
    p = run_trace("store", "show", "nothing", "--store", store)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_internal_errors_exit_1_with_a_hint(monkeypatch, tmp_path):
    from trace_cli.store import Store

    def boom(self, kind=None):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Store, "list", boom)
    r = run_cli("store", "ls", "--store", tmp_path)
    assert r.exit_code == 1
    assert (
        r.stderr.strip()
        == "error: internal error: RuntimeError: disk on fire (rerun with -v for the traceback)"
    )
    r = run_cli("-v", "store", "ls", "--store", tmp_path)
    assert r.exit_code == 1 and "Traceback" in r.stderr and "disk on fire" in r.stderr


def test_exit_codes(tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    assert run_cli("store", "ls", "--store", store).exit_code == 0
    # 2: usage errors, from click and from trace
    assert run_cli("nosuchcommand").exit_code == 2
    assert run_cli("store", "ls", "--bogus").exit_code == 2
    assert run_cli("ingest", "tau2").exit_code == 2
    assert run_cli("store", "ls", "--kind", "widgets", "--store", store).exit_code == 2
    assert run_cli("ingest", "jsonl", tmp_path / "missing.jsonl", "--store", store).exit_code == 2
    # 1: ran, but a check failed
    art = next((store / "rollouts").iterdir())
    (art / "episodes.parquet").write_bytes(b"tampered")
    r = run_cli("store", "verify", "--store", store)
    assert r.exit_code == 1 and "changed episodes.parquet" in r.stdout


def test_keyboard_interrupt_maps_to_130(monkeypatch, tmp_path):
    from trace_cli.store import Store

    def interrupted(self, kind=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "list", interrupted)
    r = run_cli("store", "ls", "--store", tmp_path)
    assert r.exit_code == 130
    assert "interrupted" in r.stderr and "Traceback" not in r.stderr


def _open_files(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def test_ctrl_c_turned_into_a_library_error_still_maps_to_130(monkeypatch, tmp_path):
    """DuckDB converts a Ctrl-C that lands in its main-thread calls into RuntimeError('Query interrupted')."""
    from trace_cli.store import Store

    def duckdb_like(self, kind=None):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise RuntimeError("Query interrupted") from None

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(Store, "list", duckdb_like)
    r = run_cli("store", "ls", "--store", tmp_path)
    assert r.exit_code == 130 and "interrupted" in r.stderr and "internal error" not in r.stderr
    assert signal.getsignal(signal.SIGINT) is before  # main() restores the handler it replaced
    monkeypatch.undo()
    r = run_cli("store", "ls", "--store", tmp_path)  # the flag does not leak into the next invocation
    assert r.exit_code == 0


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the process's open files")
def test_sigint_interrupts_a_running_query(tmp_path):
    """Ctrl-C during a long DuckDB query stops it promptly with exit code 130."""
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    exe = BIN / "trace"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]
    slow = "select count(*) from range(100000000000) t(a) where a % 7 = 3"
    p = subprocess.Popen(
        cmd + ["store", "sql", slow, "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TRACE_NO_PROGRESS="1"),
    )
    try:
        # once the process holds the index open it is inside the query (past imports, which Ctrl-C may
        # interrupt less gracefully); give it a moment to start executing
        index = os.path.realpath(store / "index.duckdb")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and index not in _open_files(p.pid):
            time.sleep(0.02)
        time.sleep(0.2)
        assert p.poll() is None, p.communicate()
        t = time.perf_counter()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        print(f"stopped {time.perf_counter() - t:.3f}s after SIGINT")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


def test_store_default_is_env_then_cwd(tmp_path):
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    work = tmp_path / "work"
    work.mkdir()
    # no --store, no $TRACE_STORE: ./store in the current directory
    r = run_trace("ingest", "jsonl", f, "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    aid = json.loads(r.stdout)["id"]
    assert (work / "store" / "rollouts" / aid / "manifest.yaml").is_file()
    # $TRACE_STORE wins over ./store
    env_store = tmp_path / "env_store"
    r = run_trace("ingest", "jsonl", f, "--json", cwd=work, env={"TRACE_STORE": str(env_store)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["skipped"] is False
    assert (env_store / "rollouts" / aid / "manifest.yaml").is_file()
    ls = run_trace("store", "ls", "--json", cwd=tmp_path, env={"TRACE_STORE": str(env_store)})
    assert [a["id"] for a in json.loads(ls.stdout)] == [aid]
    # --store wins over both
    flag_store = tmp_path / "flag_store"
    r = run_trace("ingest", "jsonl", f, "--store", flag_store, cwd=work, env={"TRACE_STORE": str(env_store)})
    assert r.returncode == 0, r.stderr
    assert (flag_store / "rollouts" / aid).is_dir()
    assert sorted(p.name for p in work.iterdir()) == ["store"]
    assert Path(
        json.loads(run_trace("store", "show", aid, "--json", cwd=work).stdout)["path"]
    ).is_relative_to(work)
