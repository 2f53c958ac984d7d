"""Atomic artifact writes: a SIGKILLed writer leaves no visible artifact; `gc` cleans up; the next run succeeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from trace_testing import episode, run_cli, run_trace, write_jsonl

from trace_cli.store import Store, maintenance

WRITER = textwrap.dedent(
    """
    import sys, time
    from trace_cli.store import Store

    store, hang = sys.argv[1], sys.argv[2] == "hang"
    with Store(store).writer("eval", "test", {"n": 1}, name="half") as w:
        (w.path / "report.json").write_text("[" + "1, " * 50000 + "1]")
        if hang:
            print("ready", flush=True)
            time.sleep(60)
    print("committed", w.artifact.id, flush=True)
    """
)


def _start_writer(store, mode):
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(store), mode], stdout=subprocess.PIPE, text=True, env=env
    )


def test_sigkill_mid_write_leaves_no_artifact(store):
    p = _start_writer(store, "hang")
    try:
        assert p.stdout.readline().strip() == "ready"
        tmp = list((store / ".tmp").iterdir())
        assert len(tmp) == 1 and (tmp[0] / "report.json").is_file()
        # a live writer's temp dir is not garbage
        r = run_cli("store", "gc", "--store", store)
        assert r.exit_code == 0 and "removed 0" in r.stdout
        assert tmp[0].exists()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    # nothing visible: no artifact, no manifest anywhere, no name
    ls = run_trace("store", "ls", "--json", "--store", store)
    assert ls.returncode == 0, ls.stderr
    assert json.loads(ls.stdout) == []
    assert not list(store.rglob("manifest.yaml"))
    assert Store(store).list() == [] and Store(store).names() == []
    assert not (store / "eval").exists() or not list((store / "eval").iterdir())
    r = run_cli("store", "show", "half", "--store", store)
    assert r.exit_code == 2 and "no artifact named or with id 'half'" in r.stderr
    # the half-written temp dir is still there until gc
    (leftover,) = list((store / ".tmp").iterdir())
    assert (leftover / "report.json").is_file()
    dry = run_trace("store", "gc", "--dry-run", "--store", store)
    assert dry.returncode == 0 and f"would remove {leftover}" in dry.stdout and leftover.exists()
    gc = run_trace("store", "gc", "--store", store)
    assert gc.returncode == 0, gc.stderr
    assert f"removed {leftover}" in gc.stdout and "gc: removed 1 half-written directory" in gc.stdout
    assert list((store / ".tmp").iterdir()) == []
    # the next run succeeds and commits
    p = _start_writer(store, "go")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    aid = out.split()[-1]
    ls = json.loads(run_trace("store", "ls", "--json", "--store", store).stdout)
    assert [(a["id"], a["names"]) for a in ls] == [(aid, ["half"])]
    assert run_trace("store", "verify", "--store", store).returncode == 0


@pytest.mark.parametrize("where", ["before_manifest", "kind_dir_without_manifest"])
def test_gc_removes_artifact_dirs_without_manifest(store, tmp_path, where):
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    # a killed commit can leave a renamed directory whose manifest was never written: not an artifact
    orphan = store / "rollouts" / "0123456789abcdef"
    orphan.mkdir()
    (orphan / "episodes.parquet").write_bytes(b"partial")
    if where == "before_manifest":
        (orphan / "manifest.yaml.tmp").write_text("kind: rollouts\n")
    assert len(Store(store).list()) == 1
    assert run_cli("store", "verify", "--store", store).exit_code == 0
    # a fresh one is left alone for a grace period (defence in depth against a writer still renaming)
    r = run_cli("store", "gc", "--store", store)
    assert r.exit_code == 0 and "removed 0" in r.stdout and orphan.exists()
    old = time.time() - maintenance.GC_GRACE_S - 5
    os.utime(orphan, (old, old))
    r = run_cli("store", "gc", "--store", store)
    assert r.exit_code == 0 and f"removed {orphan}" in r.stdout
    assert not orphan.exists() and len(Store(store).list()) == 1


def test_sigkill_during_ingest_then_rerun(tau2_dir, tmp_path):
    """Kill a real `trace ingest` at a random point of a large file; the store is either empty or complete."""
    store = tmp_path / "store"
    big = tmp_path / "big.jsonl"
    rec = episode("x")
    with open(big, "w") as fh:
        for i in range(4000):
            rec["episode_id"] = f"e{i}"
            fh.write(json.dumps(rec) + "\n")
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    p = subprocess.Popen(
        [sys.executable, "-m", "trace_cli", "ingest", "jsonl", str(big), "--store", str(store)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        p.wait(timeout=1.2)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    arts = Store(store).list()
    assert len(arts) in (0, 1)
    if arts:  # it finished before the kill: then it is complete
        assert run_cli("store", "verify", "--store", store).exit_code == 0
    gc = run_cli("store", "gc", "--store", store)
    if store.exists():
        assert gc.exit_code == 0, gc.output
    else:  # killed before the store was created (a loaded machine): gc says so instead of claiming success
        assert gc.exit_code == 2 and "does not exist" in gc.output, gc.output
    assert not (store / ".tmp").exists() or list((store / ".tmp").iterdir()) == []
    r = run_cli("ingest", "jsonl", big, "--json", "--store", store)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"]["episodes"] == 4000
    assert run_cli("store", "verify", "--store", store).exit_code == 0


def test_gc_removes_the_temp_index_of_a_killed_reindex(store, tmp_path):
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    leftover = store / f".index-{pid}-abc123.duckdb"
    leftover.write_bytes(b"half an index")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = store / f".index-{sleeper.pid}-def456.duckdb"  # a reindex still running in another process
        live.write_bytes(b"in progress")
        r = run_cli("store", "gc", "--dry-run", "--store", store)
        assert f"would remove {leftover}" in r.stdout and leftover.exists()
        assert str(live) not in r.stdout
        r = run_cli("store", "gc", "--store", store)
        assert r.exit_code == 0 and f"removed {leftover}" in r.stdout
        assert not leftover.exists() and live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert f"removed {live}" in run_cli("store", "gc", "--store", store).stdout
    q = run_cli("store", "sql", "select count(*) as n from episodes", "--json", "--store", store)
    assert json.loads(q.stdout) == [{"n": 1}]


def test_gc_keeps_resumable_training_work_dirs_unless_asked(tmp_path):
    """A killed GRPO run leaves STORE/.tmp/train-<id>/ with a RESUMABLE marker: gc keeps it (for --resume)
    while its lock is held or by default, and removes it with include_resumable."""
    import fcntl

    from trace_cli.store import Store

    st = Store(tmp_path / "store")
    work = st.tmp_root / "train-0123456789abcdef"
    (work / "checkpoints").mkdir(parents=True)
    (work / "RESUMABLE").write_text("{}\n")
    stale = st.tmp_root / "rollouts-0123456789abcdef-999999-deadbeef"
    stale.mkdir()
    removed = st.gc()
    assert str(stale) in removed and work.is_dir()
    with open(work / ".lock", "a+") as fh:  # a live run holds the lock: never touched
        fcntl.flock(fh, fcntl.LOCK_EX)
        assert st.gc(include_resumable=True) == [] and work.is_dir()
    assert st.gc(include_resumable=True) == [str(work)] and not work.exists()
