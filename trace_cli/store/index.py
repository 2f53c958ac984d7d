"""The derived DuckDB index: tables `artifacts`, `lineage`, `names` and views over the Parquet files.

The files are the truth; this index is rebuilt from manifests by `rebuild()` at any time. Connections are
short-lived (DuckDB allows one writer process) and retried while another process holds the lock. The file
is written in the v1.5 storage format so the plain `duckdb` CLI (1.5 LTS or 2.x) opens it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trace_cli.errors import StoreError
from trace_cli.store.layout import KINDS, MANIFEST
from trace_cli.store.tables import TABLES

if TYPE_CHECKING:
    from trace_cli.store.artifacts import Artifact
    from trace_cli.store.artifacts import Artifacts as Store

STORAGE_VERSION = "v1.5.0"
LOCK = ".index.lock"  # advisory lock file held while the index is written
_LOCK_WAIT_S = 30.0

DDL = [
    """CREATE TABLE IF NOT EXISTS artifacts (
        id VARCHAR NOT NULL, kind VARCHAR NOT NULL, stage VARCHAR, created_at TIMESTAMP,
        trace_cli_version VARCHAR, path VARCHAR, digest VARCHAR, config_digest VARCHAR,
        config JSON, summary JSON, n_files INTEGER, bytes BIGINT, PRIMARY KEY (kind, id))""",
    """CREATE TABLE IF NOT EXISTS lineage (
        child_kind VARCHAR, child_id VARCHAR, parent_kind VARCHAR, parent_id VARCHAR, role VARCHAR,
        parent_path VARCHAR, parent_digest VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS names (kind VARCHAR, name VARCHAR, id VARCHAR, PRIMARY KEY (kind, name))""",
]


class IndexUnreadable(StoreError):
    """index.duckdb exists but DuckDB cannot open it. It is derived from the manifests, so this is repaired by
    rebuilding it: exit 2 with that hint."""

    exit_code = 2

    def __init__(self, path: Path, err: Exception):
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        super().__init__(
            f"cannot read the store index {path}: {first}",
            hint="the index is derived from the manifests: rebuild it with `trace store reindex`",
        )


def _connect(path: Path, read_only: bool = False):
    """A connection whose relative file paths resolve inside the store (the index's directory): the views
    name their Parquet files relative to the store root, so a copied or moved store reads its own files."""

    con = _open(path, read_only)
    con.execute(f"SET file_search_path = {_sql_str(str(path.parent))}")
    return con


def _open(path: Path, read_only: bool):
    import duckdb

    deadline = time.monotonic() + _LOCK_WAIT_S
    delay = 0.05
    while True:
        try:
            if read_only:
                return duckdb.connect(str(path), read_only=True)
            return duckdb.connect(str(path), config={"storage_compatibility_version": STORAGE_VERSION})
        except duckdb.IOException as e:
            if "lock" not in str(e).lower():
                raise IndexUnreadable(path, e) from e
            if time.monotonic() > deadline:
                raise StoreError(f"cannot open {path}: {e}") from e
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except duckdb.Error as e:  # not a DuckDB file, a truncated one, another storage version, ...
            raise IndexUnreadable(path, e) from e


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _insert_artifact(con, store: Store, art: Artifact) -> None:
    m = art.manifest
    con.execute("DELETE FROM artifacts WHERE kind = ? AND id = ?", [art.kind, art.id])
    con.execute("DELETE FROM lineage WHERE child_kind = ? AND child_id = ?", [art.kind, art.id])
    files = m.get("files", [])
    con.execute(
        "INSERT INTO artifacts VALUES (?, ?, ?, CAST(? AS TIMESTAMPTZ), ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            art.id,
            art.kind,
            m.get("stage"),
            m.get("created_at"),
            m.get("trace_cli_version"),
            _rel(store, art.path),
            m.get("digest"),
            m.get("config_digest"),
            json.dumps(m.get("config", {}), default=str),
            json.dumps(m.get("summary", {}), default=str),
            len(files),
            sum(int(f.get("size", 0)) for f in files),
        ],
    )
    rows = [
        [art.kind, art.id, i.get("kind"), i.get("id"), i.get("role"), i.get("path"), i.get("digest")]
        for i in m.get("inputs", [])
    ]
    if rows:
        con.executemany("INSERT INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _rel(store: Store, path: Path) -> str:
    """A path inside the store, relative to its root (what the index records and its views read)."""
    try:
        return Path(path).relative_to(store.root).as_posix()
    except ValueError:
        return str(path)


def _refresh_names(con, store: Store) -> None:
    con.execute("DELETE FROM names")
    rows = [list(r) for r in store.names()]
    if rows:
        con.executemany("INSERT INTO names VALUES (?, ?, ?)", rows)


def _refresh_views(con, store: Store, kinds: set[str] | None = None) -> None:
    for spec in TABLES.values():
        if kinds is not None and spec.kind not in kinds:
            continue
        rows = con.execute(
            "SELECT path FROM artifacts WHERE kind = ? ORDER BY created_at, id", [spec.kind]
        ).fetchall()
        # a table file that is a symbolic link is left out (never followed; `trace store verify` reports it)
        files = [
            f"{p}/{spec.file}"
            for (p,) in rows
            if (store.root / p / spec.file).is_file() and not os.path.islink(store.root / p / spec.file)
        ]
        if files:
            lst = "[" + ", ".join(_sql_str(f) for f in files) + "]"
            pattern = _sql_str(f"(?:^|/){spec.kind}/([0-9a-f]{{16}})/[^/]+$")
            sql = (
                f"CREATE OR REPLACE VIEW {spec.view} AS SELECT * EXCLUDE (filename), "
                f"regexp_extract(filename, {pattern}, 1) AS artifact_id "
                f"FROM read_parquet({lst}, union_by_name = true, filename = true)"
            )
        else:
            sql = (
                f"CREATE OR REPLACE VIEW {spec.view} AS SELECT {spec.empty_select()}, "
                "CAST(NULL AS VARCHAR) AS artifact_id WHERE false"
            )
        con.execute(sql)


def _moved(con, store: Store) -> bool:
    """True when the index holds absolute paths (written by an older version, whose views would read another
    location's files after a copy): it is rebuilt. Indexes written now name files relative to the store."""
    import duckdb

    try:
        row = con.execute("SELECT count(*) FROM artifacts WHERE starts_with(path, '/')").fetchone()
    except duckdb.Error:  # no artifacts table: not an index this version wrote
        return True
    return bool(row and row[0])


@contextlib.contextmanager
def _write_lock(store: Store) -> Iterator[None]:
    """Serialise index writers across processes, so a first-time build or `reindex` (which replaces the
    file) cannot race another process's add and drop its artifact from the index."""
    store.ensure()
    try:
        import fcntl
    except ImportError:  # not POSIX: DuckDB's own file lock still serialises the writes themselves
        yield
        return
    with open(store.root / LOCK, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def add_artifact(store: Store, art: Artifact) -> None:
    """Index one newly committed artifact (rebuilds the whole index if it does not exist yet)."""
    with _write_lock(store):
        if not store.index_path.exists():
            _rebuild(store)
            return
        try:
            con = _connect(store.index_path)
        except IndexUnreadable:  # derived data: rebuild it rather than leave the new artifact unindexed
            _rebuild(store)
            return
        if _moved(con, store):
            con.close()
            _rebuild(store)
            return
        try:
            for ddl in DDL:
                con.execute(ddl)
            con.execute("BEGIN TRANSACTION")
            _insert_artifact(con, store, art)
            _refresh_names(con, store)
            _refresh_views(con, store, {art.kind})
            con.execute("COMMIT")
        finally:
            con.close()


def rebuild(store: Store) -> dict[str, int]:
    """Build a fresh index from the manifests into a temp file, then atomically replace the old one."""
    with _write_lock(store):
        return _rebuild(store)


def _rebuild(store: Store) -> dict[str, int]:
    tmp = store.root / f".index-{os.getpid()}-{uuid.uuid4().hex[:6]}.duckdb"
    tmp_wal = Path(str(tmp) + ".wal")
    arts = store.list()
    try:
        con = _connect(tmp)
        try:
            for ddl in DDL:
                con.execute(ddl)
            for art in arts:
                _insert_artifact(con, store, art)
            _refresh_names(con, store)
            _refresh_views(con, store)
            counts = {"artifacts": len(arts), "names": len(store.names())}
            counts["lineage"] = con.execute("SELECT count(*) FROM lineage").fetchone()[0]
        finally:
            con.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp_wal.unlink(missing_ok=True)
        raise
    # a WAL left by a process killed while writing the old index must not be replayed onto the new one
    wal = Path(str(store.index_path) + ".wal")
    wal.unlink(missing_ok=True)
    os.replace(tmp, store.index_path)
    if tmp_wal.exists():
        os.replace(tmp_wal, wal)
    return counts


def committed(store: Store) -> set[tuple[str, str]]:
    """(kind, id) of every artifact with a manifest (one stat per directory; no manifest is parsed)."""
    out = set()
    for k in KINDS:
        kd = store.root / k
        if kd.is_dir():
            out |= {(k, d.name) for d in kd.iterdir() if (d / MANIFEST).is_file()}
    return out


def indexed(store: Store) -> set[tuple[str, str]]:
    """(kind, id) of every artifact the index lists."""
    import duckdb

    con = _open(store.index_path, read_only=True)
    try:
        return {(k, i) for k, i in con.execute("SELECT kind, id FROM artifacts").fetchall()}
    except duckdb.Error as e:
        raise IndexUnreadable(store.index_path, e) from e
    finally:
        con.close()


def sync(store: Store) -> list[str]:
    """Bring the index in line with the manifests: add committed artifacts it lacks (a run killed between
    its commit and its index update), drop rows whose artifact is gone. Returns what changed, as KIND/ID."""
    if not store.index_path.exists() or committed(store) == indexed(store):
        return []
    with _write_lock(store):
        disk, idx = committed(store), indexed(store)
        missing, stale = sorted(disk - idx), sorted(idx - disk)
        if not missing and not stale:
            return []
        arts = [store.get(k, i) for k, i in missing]
        con = _connect(store.index_path)
        try:
            con.execute("BEGIN TRANSACTION")
            for art in arts:
                _insert_artifact(con, store, art)
            for k, i in stale:
                con.execute("DELETE FROM artifacts WHERE kind = ? AND id = ?", [k, i])
                con.execute("DELETE FROM lineage WHERE child_kind = ? AND child_id = ?", [k, i])
            _refresh_names(con, store)
            _refresh_views(con, store, {k for k, _ in missing + stale})
            con.execute("COMMIT")
        finally:
            con.close()
    return [f"{k}/{i}" for k, i in missing + stale]
