"""`trace store sql` is read-only and confined to the store (issue 14): statements that write or escape are
refused with exit 2 before they run, and the connection itself cannot touch other files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import pytest
from trace_testing import TAU2_FILES, run_cli, run_trace, snapshot

from trace_cli.store import Store
from trace_cli.store.sql import confined_connection


@pytest.fixture(scope="module")
def tau2_store(tmp_path_factory) -> Path:
    from trace_testing import TAU2_DIR

    store = tmp_path_factory.mktemp("sqlconf") / "store"
    r = run_trace("ingest", "tau2", TAU2_DIR / TAU2_FILES["telecom"], "--name", "tel", "--store", store)
    assert r.returncode == 0, r.stderr
    return store


def _parquet(store: Path) -> Path:
    (p,) = sorted(store.glob("rollouts/*/episodes.parquet"))
    return p


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _refused(store: Path, sql: str, *msgs: str, cwd: Path | None = None):
    before = snapshot(store)
    r = run_trace("store", "sql", sql, "--store", store, cwd=cwd)
    assert r.returncode == 2, (sql, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    for m in msgs:
        assert m in r.stderr, (sql, r.stderr)
    assert snapshot(store) == before, sql
    return r


def test_copy_to_an_artifacts_parquet_is_refused_and_the_file_unchanged(tau2_store, tmp_path):
    p = _parquet(tau2_store)
    digest = _sha(p)
    rel = p.relative_to(tau2_store).as_posix()
    for sql in (
        f"COPY (SELECT 1 AS x) TO '{p}' (FORMAT parquet)",
        f"copy episodes to '{rel}' (format parquet)",
        f"SELECT 1; COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'",  # hidden after a harmless statement
    ):
        _refused(tau2_store, sql, "refused SQL statement", "COPY")
    assert _sha(p) == digest and not (tmp_path / "out.csv").exists()
    assert run_trace("store", "verify", "--store", tau2_store).returncode == 0


def test_export_database_is_refused(tau2_store, tmp_path):
    out = tmp_path / "exported"
    _refused(tau2_store, f"EXPORT DATABASE '{out}'", "refused SQL statement", "EXPORT DATABASE writes files")
    assert not out.exists()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM glob('/root/*')",
        "FROM read_csv('/etc/passwd')",
    ],
)
def test_reading_outside_the_store_is_refused(tau2_store, sql):
    r = _refused(tau2_store, sql, "refused", "file system operations are disabled")
    assert "root:" not in r.stdout


def test_reading_outside_through_a_relative_path_is_refused(tau2_store):
    # file_search_path resolves relative names inside the store; `..` must not lead out of it
    _refused(tau2_store, "SELECT * FROM read_text('rollouts/../../../../../../etc/passwd')", "refused")


@pytest.mark.parametrize(
    "sql, why",
    [
        ("INSTALL httpfs", "INSTALL/LOAD"),
        ("LOAD httpfs", "INSTALL/LOAD"),
        ("ATTACH '/tmp/trace-attach-test.db' AS x", "ATTACH"),
        ("CREATE TABLE t AS SELECT 1", "CREATE"),
        ("CREATE TEMP VIEW v AS SELECT 1", "CREATE"),
        ("INSERT INTO artifacts (id, kind) VALUES ('x', 'y')", "INSERT"),
        ("UPDATE artifacts SET stage = 'x'", "UPDATE"),
        ("DELETE FROM artifacts", "DELETE"),
        ("DROP VIEW episodes", "DROP"),
        ("SET enable_external_access = true", "SET/RESET"),
        ("RESET lock_configuration", "SET/RESET"),
        ("PRAGMA enable_external_access = true", "SET/RESET"),
        ("SET file_search_path = '/'", "SET/RESET"),
        ("CALL checkpoint()", "CALL"),
        ("EXPLAIN ANALYZE COPY episodes TO 'x.parquet'", "COPY"),
        ("COPY FROM DATABASE memory TO x", "COPY FROM DATABASE attaches and writes a database"),
        ("PIVOT artifacts ON kind USING count(*)", "PIVOT without an IN list writes"),
        ("/* a comment */ CHECKPOINT", "CHECKPOINT is not read-only: it writes the database file"),
        ("FORCE CHECKPOINT", "FORCE CHECKPOINT is not read-only"),
        ("EXPLAIN (ANALYZE, FORMAT json) COPY episodes TO 'x.parquet'", "COPY"),
        ("EXPLAIN /* a comment */ ANALYZE COPY episodes TO 'x.parquet'", "COPY"),
        ("UPDATE EXTENSIONS", "does not know"),
        ("EXPLAIN ANALYZE UPDATE EXTENSIONS", "does not know"),
    ],
)
def test_writing_and_escaping_statements_are_refused(tau2_store, sql, why):
    _refused(tau2_store, sql, "refused SQL statement", why)
    assert not Path("/tmp/trace-attach-test.db").exists()


@pytest.mark.parametrize("sql", ["", "   ", "/* only a comment */", ";", "\n-- a comment\n"])
def test_an_empty_query_is_a_usage_error(tau2_store, sql):
    r = run_cli("store", "sql", sql, "--store", tau2_store)
    assert r.exit_code == 2 and "empty SQL query" in r.stderr, r.output


def test_the_connection_itself_is_confined(tau2_store, tmp_path):
    """Defence in depth: even a statement that slipped past the parser check cannot write or read outside."""
    p = _parquet(tau2_store)
    digest = _sha(p)
    con = confined_connection(Store(tau2_store))
    try:
        assert con.execute("SELECT count(*) FROM episodes").fetchone()[0] == 20
        for sql in (
            f"COPY (SELECT 1 AS x) TO '{p}' (FORMAT parquet)",
            f"COPY (SELECT 1 AS x) TO '{tmp_path / 'x.parquet'}' (FORMAT parquet)",
            f"EXPORT DATABASE '{tmp_path / 'exp'}'",
            "SELECT * FROM read_text('/etc/passwd')",
            "SELECT * FROM glob('/root/*')",
            "INSTALL httpfs",
            f"ATTACH '{tmp_path / 'a.db'}'",
        ):
            with pytest.raises(duckdb.PermissionException):
                con.execute(sql)
        for sql in ("SET enable_external_access = true", "SET allowed_directories = ['/']"):
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute(sql)
        assert con.execute("SELECT current_setting('access_mode')").fetchone()[0] == "read_only"
    finally:
        con.close()
    assert _sha(p) == digest and list(tmp_path.iterdir()) == []


def test_reading_queries_still_work_from_another_directory(tau2_store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    queries = {
        "SELECT count(*) AS n, round(avg(reward), 3) AS r FROM episodes": [{"n": 20, "r": 0.7}],
        "SELECT count(*) > 0 AS any FROM tool_calls": [{"any": True}],
        "WITH a AS (SELECT kind FROM artifacts) SELECT kind, count(*) AS n FROM a GROUP BY ALL": [
            {"kind": "rollouts", "n": 1}
        ],
        "SELECT name FROM names": [{"name": "tel"}],
    }
    for sql, want in queries.items():
        r = run_trace("store", "sql", sql, "--json", "--store", tau2_store, cwd=elsewhere)
        assert r.returncode == 0, (sql, r.stderr)
        assert json.loads(r.stdout) == want, sql
    for sql in ("DESCRIBE episodes", "SHOW TABLES", "PRAGMA table_info('episodes')", "EXPLAIN SELECT 1"):
        r = run_trace("store", "sql", sql, "--store", tau2_store, cwd=elsewhere)
        assert r.returncode == 0, (sql, r.stderr)
    # the store given by $TRACE_STORE, relative to the working directory
    rel = os.path.relpath(tau2_store, elsewhere)
    r = run_trace(
        "store",
        "sql",
        "SELECT count(*) AS n FROM episodes",
        "--json",
        cwd=elsewhere,
        env={"TRACE_STORE": rel},
    )
    assert r.returncode == 0 and json.loads(r.stdout) == [{"n": 20}], r.stderr


@pytest.mark.parametrize(
    "sql, code",
    [
        ("EXPLAIN (FORMAT json) SELECT 1", 0),
        ("EXPLAIN (FORMAT json) SELECT count(*) FROM episodes", 0),
        ("EXPLAIN /*c*/ ANALYZE SELECT 1", 0),
        ("EXPLAIN -- why\n ANALYZE (FORMAT json) SELECT count(*) FROM tool_calls", 0),
        ("UPDATE EXTENSIONS", 2),
        ("UPDATE EXTENSIONS (httpfs)", 2),
        ("EXPLAIN", 2),
        ("EXPLAIN (FORMAT json)", 2),
        ("EXPLAIN EXPLAIN SELECT 1", 2),
    ],
)
def test_explain_forms_and_unknown_statement_types_are_never_internal_errors(tau2_store, sql, code):
    """Issue 25 item 7: EXPLAIN with an option list or a comment before ANALYZE runs (it only reads), a
    statement type the Python client cannot name is refused; neither ends as an internal error (exit 1)."""
    before = snapshot(tau2_store)
    r = run_trace("store", "sql", sql, "--store", tau2_store)
    assert r.returncode == code, (sql, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    if code == 0:
        assert "plan" in r.stdout, r.stdout
    assert snapshot(tau2_store) == before
