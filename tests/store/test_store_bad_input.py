"""User mistakes around the store get exit 2 and a message that names the path and the fix, never an
`internal error`, and leave the store unchanged (issue 14, item 7)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trace_testing import TAU2_DIR, TAU2_FILES, episode, run_trace, snapshot, write_jsonl

from trace_cli.store import Store


@pytest.fixture
def one(tmp_path) -> Path:
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    r = run_trace("ingest", "jsonl", f, "--store", store)
    assert r.returncode == 0, r.stderr
    return store


def _usage_error(r, *msgs: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    for m in msgs:
        assert m in r.stderr, (m, r.stderr)


def _read_only(store: Path, *args) -> subprocess.CompletedProcess:
    """Run `trace ARGS` with `store` mounted read-only (root ignores file permissions, so a mount namespace
    makes the store really read-only; as a normal user, permissions do)."""
    e = dict(os.environ, TRACE_NO_PROGRESS="1")
    e.pop("TRACE_STORE", None)
    cmd = [str(Path(sys.executable).parent / "trace"), *map(str, args)]
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("needs unshare(1) to make a read-only mount as root")
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", script, str(store), *cmd]
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120)
    for p in [store, *store.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120)
    finally:
        for p in [store, *store.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_read_only_store(one, tmp_path):
    before = snapshot(one)
    other = write_jsonl(tmp_path / "f.jsonl", [episode("f1")])
    r = _read_only(one, "ingest", "jsonl", other, "--store", one)
    _usage_error(r, f"store {one}", "is not writable", "--store")
    assert snapshot(one) == before
    # reading still works on a read-only store
    r = _read_only(one, "store", "sql", "SELECT count(*) AS n FROM episodes", "--json", "--store", one)
    assert r.returncode == 0 and '"n": 1' in r.stdout, r.stderr
    r = _read_only(one, "store", "verify", "--store", one)
    assert r.returncode == 0, r.stderr
    assert snapshot(one) == before


def test_gc_on_a_read_only_store_removes_nothing_and_says_so(one):
    """Issue 25 item 8: gc used to print "removed 1 half-written directory" (exit 0) and remove nothing."""
    leftover = one / ".tmp" / "rollouts-0123456789abcdef-999999999-deadbeef"
    leftover.mkdir(parents=True)
    (leftover / "episodes.parquet").write_bytes(b"partial")
    before = snapshot(one)
    r = _read_only(one, "store", "gc", "--store", one)
    _usage_error(r, f"store {one}", "read-only", "nothing was removed")
    assert "removed" not in r.stdout, r.stdout
    assert snapshot(one) == before and leftover.is_dir()
    # listing still works, and where the store is writable the same leftover goes
    r = _read_only(one, "store", "gc", "--dry-run", "--store", one)
    assert r.returncode == 0 and f"would remove {leftover}" in r.stdout, r.stdout + r.stderr
    r = run_trace("store", "gc", "--store", one)
    assert r.returncode == 0 and f"removed {leftover}" in r.stdout, r.stdout + r.stderr
    assert not leftover.exists()


@pytest.mark.parametrize(
    "cmd", [["store", "ls"], ["store", "sql", "SELECT 1"], ["store", "verify"], ["ingest", "jsonl"]]
)
def test_trace_store_pointing_at_a_file(tmp_path, cmd):
    f = tmp_path / "not-a-dir"
    f.write_text("hello")
    args = list(cmd)
    if cmd[0] == "ingest":
        args.append(write_jsonl(tmp_path / "e.jsonl", [episode("e1")]))
    r = run_trace(*args, env={"TRACE_STORE": str(f)})
    _usage_error(r, f"store {f}", "$TRACE_STORE", "is not a directory")
    assert f.read_text() == "hello"


@pytest.mark.parametrize("cmd", [["store", "ls"], ["store", "gc"], ["ingest", "jsonl"]])
def test_store_dev_null(tmp_path, cmd):
    args = list(cmd)
    if cmd[0] == "ingest":
        args.append(write_jsonl(tmp_path / "e.jsonl", [episode("e1")]))
    r = run_trace(*args, "--store", "/dev/null")
    _usage_error(r, "/dev/null", "is not a directory")
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("cmd", [["store", "verify"], ["store", "gc"], ["store", "gc", "--dry-run"]])
def test_verify_and_gc_on_a_missing_store(tmp_path, cmd):
    missing = tmp_path / "nope"
    r = run_trace(*cmd, "--store", missing)
    _usage_error(r, f"store {missing}", "does not exist")
    assert not missing.exists()


@pytest.mark.parametrize("sql", ["", "  \n "])
def test_empty_sql_query(one, sql):
    before = snapshot(one)
    r = run_trace("store", "sql", sql, "--store", one)
    _usage_error(r, "empty SQL query")
    assert snapshot(one) == before


@pytest.mark.parametrize(
    "text, msg",
    [
        ("kind: rollouts\nid: [unclosed\n", "malformed manifest"),
        ("- just\n- a list\n", "not a mapping"),
        ("kind: rollouts\n", "missing or mistyped: id, digest, files"),
        ("kind: rollouts\nkind: rollouts\n", "duplicate key 'kind'"),
        ("\xff\xfe", "malformed manifest"),
    ],
)
@pytest.mark.parametrize("cmd", [["store", "ls"], ["store", "show", "mine"], ["store", "sql", "SELECT 1"]])
def test_a_malformed_manifest(one, tmp_path, text, msg, cmd):
    (art,) = Store(one).list()
    if cmd[1] == "show":
        Store(one).set_name("rollouts", "mine", art.id)
    m = art.path / "manifest.yaml"
    m.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    if cmd[1] == "sql":  # the index does not know the artifact yet: the repair step reads the manifest
        (one / "index.duckdb").unlink()
    before = snapshot(one)
    r = run_trace(*cmd, "--store", one)
    _usage_error(r, str(m), msg, "trace store reindex", "trace store verify")
    assert snapshot(one) == before
    # verify reports it as a damaged artifact (a failed check: exit 1), naming the file
    v = run_trace("store", "verify", "--store", one)
    assert v.returncode == 1 and msg in v.stdout and "internal error" not in v.stderr, v.stdout + v.stderr


@pytest.mark.parametrize("garbage", [b"", b"not a duckdb file at all" * 100, b"\0" * 8192])
def test_a_corrupt_index(tmp_path, garbage):
    store = tmp_path / "store"
    r = run_trace("ingest", "tau2", TAU2_DIR / TAU2_FILES["telecom"], "--store", store)
    assert r.returncode == 0, r.stderr
    (store / "index.duckdb").write_bytes(garbage)
    before = snapshot(store)
    r = run_trace("store", "sql", "SELECT count(*) FROM episodes", "--store", store)
    _usage_error(r, f"cannot read the store index {store / 'index.duckdb'}", "trace store reindex")
    assert snapshot(store) == before
    assert run_trace("store", "reindex", "--store", store).returncode == 0
    r = run_trace("store", "sql", "SELECT count(*) AS n FROM episodes", "--json", "--store", store)
    assert r.returncode == 0 and '"n": 20' in r.stdout, r.stderr


def test_a_reference_of_the_wrong_kind_names_it_with_the_right_article(tmp_path):
    """Messages say "an environment artifact" and "an eval reference", never "a environment"."""
    from trace_cli.errors import UsageError
    from trace_cli.models.refs import resolve_model

    st = Store(tmp_path / "store")
    with st.writer("environment", "synthesize", {"x": 1}, [], name="env1") as w:
        (w.path / "environment.yaml").write_text("kind: environment\n")
    with pytest.raises(UsageError, match=r"is an environment artifact, not a model"):
        resolve_model("store://environment/env1", st)
    with pytest.raises(UsageError, match=r"is an environment reference, but an eval artifact is needed here"):
        st.resolve("environment/env1", kind="eval")
