"""A store handed over by someone else cannot harm its user (issue 46, item 1): the store never follows a
symbolic link out of itself. A link where `.tmp`, `.pending`, `names/`, a `names/` entry or an artifact
directory should be is refused with exit 2 naming the link; nothing outside the store changes and nothing of
the link's target is printed; `trace store verify` reports such links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from trace_testing import episode, run_trace, snapshot, write_jsonl


@pytest.fixture
def one(tmp_path) -> Path:
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    r = run_trace("ingest", "jsonl", f, "--store", store, "--name", "first")
    assert r.returncode == 0, r.stderr
    return store


@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory outside the store with files a user cares about (names like the store's own leftovers)."""
    d = tmp_path / "victim"
    d.mkdir()
    (d / "precious.txt").write_text("SECRET-CONTENT-1\n")
    (d / "rollouts-0123456789abcdef-999999-deadbeef").mkdir()
    (d / "rollouts-0123456789abcdef-999999-deadbeef" / "data").write_text("SECRET-CONTENT-2\n")
    (d / "model-0123456789abcdef-999999-cafebabe").write_text("SECRET-CONTENT-3\n")
    old = 1_000_000_000  # 2001: older than any grace period
    for p in [*d.rglob("*"), d]:
        os.utime(p, (old, old), follow_symlinks=False)
    return d


def _refused(r, link: Path) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert str(link) in r.stderr, r.stderr
    assert "symbolic link" in r.stderr, r.stderr
    assert "SECRET-CONTENT" not in r.stdout + r.stderr


@pytest.mark.parametrize("which", [".tmp", ".pending"])
@pytest.mark.parametrize("command", [("store", "ls"), ("store", "gc"), ("store", "reindex")])
def test_linked_scratch_dir_is_refused_and_nothing_outside_changes(one, victim, which, command):
    link = one / which
    if link.exists():
        os.rmdir(link)
    link.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    r = run_trace(*command, "--store", one)
    _refused(r, link)
    assert snapshot(victim) == before
    assert link.is_symlink()


def test_linked_tmp_is_refused_by_a_writer(one, victim, tmp_path):
    link = one / ".tmp"
    if link.exists():
        os.rmdir(link)
    link.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    f = write_jsonl(tmp_path / "f.jsonl", [episode("f1")])
    r = run_trace("ingest", "jsonl", f, "--store", one)
    _refused(r, link)
    assert snapshot(victim) == before


def test_linked_names_dir_is_refused(one, victim):
    names = one / "names"
    os.rename(names, one / "names-real")
    names.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    r = run_trace("store", "show", "first", "--store", one)
    _refused(r, names)
    assert snapshot(victim) == before


def test_name_linked_to_a_file_prints_nothing_of_it(one, victim):
    entry = one / "names" / "rollouts" / "evil"
    entry.symlink_to(victim / "precious.txt")
    for args in (("store", "show", "evil"), ("store", "show", "first"), ("store", "ls")):
        r = run_trace(*args, "--store", one)
        _refused(r, entry)


def test_linked_artifact_dir_is_refused(one, victim, tmp_path):
    (one / "rollouts" / "0123456789abcdef").symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    for args in (("store", "ls"), ("store", "show", "0123456789abcdef"), ("store", "gc")):
        r = run_trace(*args, "--store", one)
        _refused(r, one / "rollouts" / "0123456789abcdef")
    assert snapshot(victim) == before


def test_verify_reports_links(one, victim):
    (one / ".pending").mkdir(exist_ok=True)
    os.rmdir(one / ".pending")
    (one / ".pending").symlink_to(victim, target_is_directory=True)
    (one / "names" / "rollouts" / "evil").symlink_to(victim / "precious.txt")
    art = next(p for p in (one / "rollouts").iterdir() if p.is_dir())
    data = next(p for p in art.iterdir() if p.suffix == ".parquet")
    data.rename(victim / "moved.parquet")
    data.symlink_to(victim / "moved.parquet")
    before = snapshot(victim)
    r = run_trace("store", "verify", "--store", one)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert "internal error" not in out and "SECRET-CONTENT" not in out
    for p in (one / ".pending", one / "names" / "rollouts" / "evil", data):
        assert f"{p.relative_to(one)}" in out and "symbolic link" in out, out
    assert snapshot(victim) == before


def test_a_linked_table_file_is_not_read_by_store_sql(one, tmp_path):
    """The views over the tables leave out a table file that is a link (verify reports it)."""
    other = tmp_path / "other"
    f = write_jsonl(tmp_path / "f.jsonl", [episode("outside-1")])
    assert run_trace("ingest", "jsonl", f, "--store", other).returncode == 0
    outside = next((other / "rollouts").glob("*/episodes.parquet"))
    art = next(p for p in (one / "rollouts").iterdir() if (p / "manifest.yaml").is_file())
    (art / "episodes.parquet").unlink()
    (art / "episodes.parquet").symlink_to(outside)
    assert run_trace("store", "reindex", "--store", one).returncode == 0
    r = run_trace("store", "sql", "SELECT episode_id FROM episodes", "--csv", "--store", one)
    assert r.returncode == 0, r.stderr
    assert "outside-1" not in r.stdout, r.stdout


def test_a_linked_index_is_refused_and_its_target_untouched(one, tmp_path):
    """index.duckdb linked to another DuckDB file: no command opens (and writes) the user's other database."""
    import duckdb

    theirs = tmp_path / "theirs.duckdb"
    con = duckdb.connect(str(theirs))
    con.execute("CREATE TABLE artifacts (id VARCHAR, kind VARCHAR)")
    con.execute("INSERT INTO artifacts VALUES ('mine', 'rollouts')")
    con.close()
    before = theirs.read_bytes()
    (one / "index.duckdb").unlink()
    (one / "index.duckdb").symlink_to(theirs)
    f = write_jsonl(tmp_path / "g.jsonl", [episode("g1")])
    for args in (("store", "ls"), ("ingest", "jsonl", f), ("store", "reindex")):
        r = run_trace(*args, "--store", one)
        _refused(r, one / "index.duckdb")
    assert theirs.read_bytes() == before
