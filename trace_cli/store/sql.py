"""`trace store sql`: read-only, confined queries over the index.

The query runs on a connection that (1) opens the index read-only, (2) may read only the Parquet files the
index's views name (DuckDB `allowed_paths` plus `enable_external_access = false`: no other file, no
network, no extension loading, no Python replacement scans), (3) has its configuration locked, and (4) only
gets statements DuckDB's own parser classifies as reading (SELECT, DESCRIBE/SHOW/SUMMARIZE, EXPLAIN of those,
a few catalogue PRAGMAs). Anything else (COPY, EXPORT, ATTACH, INSTALL/LOAD, CREATE/INSERT/UPDATE/DELETE/DROP,
SET/RESET, CALL, PREPARE, ...) is refused with exit 2 before it runs.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import TYPE_CHECKING, Any

from trace_cli.errors import UsageError
from trace_cli.store import index

if TYPE_CHECKING:
    # the artifacts side is all these functions use; the facade (which imports this module) is not needed
    from trace_cli.store.artifacts import Artifacts as Store

# PRAGMAs that only describe the catalogue (everything else a PRAGMA can do is a setting or a side effect)
_READ_PRAGMAS = frozenset(
    (
        "table_info", "show", "show_tables", "show_tables_expanded", "show_databases", "database_list",
        "database_size", "storage_info", "version", "platform", "functions", "collations", "metadata_info",
        "user_agent", "disable_profiling",
    )
)  # fmt: skip
_PRAGMA_RE = re.compile(r"^\s*pragma\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_REFUSED = {
    "COPY": "COPY reads or writes files",
    "COPY_DATABASE": "COPY FROM DATABASE writes a database",
    "EXPORT": "EXPORT DATABASE writes files",
    "ATTACH": "ATTACH opens another database",
    "DETACH": "DETACH changes the attached databases",
    "LOAD": "INSTALL/LOAD of extensions is not allowed",
    "EXTENSION": "extension statements are not allowed",
    "SET": "SET/RESET/USE change the session's configuration",
    "VARIABLE_SET": "SET VARIABLE changes the session",
    "CALL": "CALL runs a procedure (use SELECT * FROM function(...) for table functions)",
    "UNKNOWN": "statements of a type this DuckDB client does not know (e.g. UPDATE EXTENSIONS) are not allowed",
}
# statements DuckDB files under another type than what they do, told apart by their first words
_REFUSED_BY_WORDS = (
    (
        ("pivot",),
        "PIVOT without an IN list writes: it runs as several statements, the first creating an enum type of "
        "the pivoted values (list them: PIVOT ... ON col IN ('a', 'b') is a plain SELECT)",
    ),
    (
        ("copy", "from", "database"),
        "COPY FROM DATABASE attaches and writes a database (it copies one into another)",
    ),
    (("checkpoint",), "CHECKPOINT is not read-only: it writes the database file"),
    (("force", "checkpoint"), "FORCE CHECKPOINT is not read-only: it writes the database file"),
)
_HINT = (
    "`trace store sql` is read-only and confined to the store: use SELECT (or DESCRIBE/SHOW/SUMMARIZE) "
    "over the views and tables (see SHOW TABLES); to work on the data elsewhere, open "
    "STORE/index.duckdb with the duckdb CLI"
)


def check_statements(con, sql: str) -> list:
    """The parsed statements of `sql` if every one only reads; UsageError (exit 2) naming the first that
    does not. Uses DuckDB's parser, so comments, quoting and multiple statements are handled as DuckDB does."""
    import duckdb

    if not sql.strip():
        raise UsageError("empty SQL query", hint='e.g. trace store sql "SELECT count(*) FROM episodes"')
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise UsageError(f"SQL error: {str(e).strip()}") from e
    except ValueError as e:  # a statement type this Python client cannot name (e.g. UPDATE EXTENSIONS)
        raise UsageError(f"refused SQL: unsupported statement ({e})", hint=_HINT) from e
    if not stmts:
        raise UsageError(
            "empty SQL query (only comments or ';')",
            hint='e.g. trace store sql "SELECT count(*) FROM episodes"',
        )
    for st in stmts:
        _check_one(con, st)
    return stmts


def _explained(query: str) -> str | None:
    """The statement that `EXPLAIN [ANALYZE] [(options)] STATEMENT` wraps, found with DuckDB's tokenizer (so
    comments anywhere and an option list such as `(FORMAT json)` are skipped as DuckDB skips them); None
    when `query` is not of that form."""
    import duckdb

    raw = list(duckdb.tokenize(query))
    ends = [p for p, _ in raw[1:]] + [len(query)]
    toks = [
        (p, t, query[p:e].strip().lower())
        for (p, t), e in zip(raw, ends, strict=True)
        if t != duckdb.token_type.comment
    ]
    i = 0
    if i < len(toks) and toks[i][2] == "explain":
        i += 1
    else:
        return None
    if i < len(toks) and toks[i][2] in ("analyze", "analyse"):
        i += 1
    if i < len(toks) and toks[i][1] == duckdb.token_type.operator and toks[i][2].startswith("("):
        depth = 0
        while i < len(toks):
            if toks[i][1] == duckdb.token_type.operator:
                depth += toks[i][2].count("(") - toks[i][2].count(")")
            i += 1
            if depth <= 0:
                break
    return query[toks[i][0] :] if i < len(toks) else None


def _check_one(con, st) -> None:
    import duckdb

    try:
        kind = st.type.name
    except ValueError:  # a statement type this Python client cannot name (e.g. UPDATE EXTENSIONS)
        kind = "UNKNOWN"
    text = " ".join(st.query.split())
    short = text if len(text) <= 60 else text[:57] + "..."
    if kind == "SELECT":
        return
    if kind == "EXPLAIN":
        inner = _explained(st.query)
        if inner is not None:
            try:
                subs = con.extract_statements(inner)
            except (duckdb.Error, ValueError) as e:
                raise UsageError(f"SQL error: {str(e).strip()}") from e
            if subs:
                for sub in subs:
                    _check_one(con, sub)
                return
    if kind == "PRAGMA":
        m = _PRAGMA_RE.match(st.query)
        if m and m.group(1).lower() in _READ_PRAGMAS:
            return
    why = _reason_by_words(st.query) or _REFUSED.get(
        kind,
        "only catalogue PRAGMAs (table_info, show_tables, ...) are allowed"
        if kind == "PRAGMA"
        else f"{kind} statements change the database",
    )
    raise UsageError(f"refused SQL statement {short!r}: {why}", hint=_HINT)


def _allowed_files(con, store: Store) -> list[str]:
    """The Parquet files the views read, each as the view names it (store-relative) and absolute: DuckDB
    checks both the name as written and the file it resolves to through `file_search_path`."""
    root = store.root.resolve()
    out: list[str] = []
    for (rel,) in con.execute("SELECT path FROM artifacts").fetchall():
        d = (root / rel).resolve()
        if not d.is_relative_to(root) or not d.is_dir():  # an index that points outside the store
            continue
        for f in sorted(d.glob("*.parquet")):
            if f.resolve().is_relative_to(root):
                out += [f"{rel}/{f.name}", str(f)]
    return out


def confined_connection(store: Store):
    """A read-only connection to the index that can read only the store's Parquet files, with its
    configuration locked."""
    con = index._open(store.index_path, read_only=True)
    try:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET allow_community_extensions = false")
        con.execute("SET allowed_paths = ?", [_allowed_files(con, store)])
        con.execute(f"SET file_search_path = {index._sql_str(str(store.root))}")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def query(store: Store, sql: str, params: list[Any] | None = None) -> tuple[list[str], list[tuple]]:
    """Run a read-only query against the index; returns (column names, rows). The index is first brought
    in line with the manifests (an artifact committed by a run killed before it indexed it is added)."""
    if not sql.strip():
        raise UsageError("empty SQL query", hint='e.g. trace store sql "SELECT count(*) FROM episodes"')
    store.check_root(must_exist=True)
    if not store.index_path.exists():
        index.rebuild(store)
    else:
        index.sync(store)
    con = confined_connection(store)
    try:
        stmts = check_statements(con, sql)
        return _run(con, stmts, params)
    finally:
        con.close()


def _run(con, stmts: list, params: list[Any] | None) -> tuple[list[str], list[tuple]]:
    import duckdb

    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            cur = None
            for i, st in enumerate(stmts):
                last = i == len(stmts) - 1
                cur = con.execute(st.query, (params or []) if last else [])
            box["cols"] = [d[0] for d in cur.description] if cur.description is not None else []
            box["rows"] = cur.fetchall() if cur.description is not None else []
        except BaseException as e:  # handed to the calling thread
            box["error"] = e
        finally:
            done.set()

    # DuckDB does not see SIGINT while it executes on the main thread, so a long query would ignore Ctrl-C:
    # run it on a worker and interrupt it from here, then re-raise (exit code 130). (An Event, not
    # Thread.join: a join interrupted by KeyboardInterrupt can leave is_alive() wrong on Python 3.11.)
    worker = threading.Thread(target=work, name="trace-sql", daemon=True)
    try:
        worker.start()
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        while not done.is_set() and worker.ident is not None:  # ident is None: it never started
            with contextlib.suppress(duckdb.Error):
                con.interrupt()
            done.wait(0.05)
        raise
    err = box.get("error")
    if isinstance(err, duckdb.PermissionException):
        raise UsageError(
            f"refused: {str(err).strip().splitlines()[0]}",
            hint="`trace store sql` reads only the store's own tables and views",
        ) from err
    if isinstance(err, duckdb.Error):
        raise UsageError(f"SQL error: {str(err).strip()}") from err
    if err is not None:
        raise err
    return box["cols"], box["rows"]


def _reason_by_words(query: str) -> str | None:
    """The refusal reason of a statement recognised by its first words (comments skipped), if any."""
    import duckdb

    words = []
    for pos, kind in duckdb.tokenize(query):
        if kind != duckdb.token_type.comment:
            words.append(re.match(r"\w*", query[pos:]).group(0).lower())
        if len(words) == 3:
            break
    for start, why in _REFUSED_BY_WORDS:
        if tuple(words[: len(start)]) == start:
            return why
    return None
