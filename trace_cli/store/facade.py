"""`Store`: the one object commands and stages use for a store root. It owns the artifacts on disk
(store/artifacts.py) and the index derived from their manifests (store/index.py), and offers maintenance
(store/maintenance.py) and confined SQL (store/sql.py).

The parts are joined here and only here: the artifact writer reports each commit through the
`after_commit` hook, which this class implements with the index update, and the index, maintenance and SQL
modules receive the store as an argument. So none of them imports another in a circle.
"""

from __future__ import annotations

import sys
from typing import Any

from trace_cli.errors import StoreError, terminal_safe
from trace_cli.store import commit
from trace_cli.store.artifacts import Artifact, Artifacts

# index, maintenance and sql are imported where used: they load pyarrow and duckdb, which a command that
# only resolves or writes artifacts does not need


class Store(Artifacts):
    """A store root: its artifacts and their index. Cheap to construct; nothing is created until something
    is written."""

    # ---------------------------------------------------------------- index
    def after_commit(self, art: Artifact) -> bool:
        return self.index_add(art)

    def index_add(self, art: Artifact) -> bool:
        """Index a committed artifact; False (with a warning) when the index could not be updated."""
        import duckdb

        from trace_cli.store import index

        try:
            index.add_artifact(self, art)
            return True
        except (StoreError, duckdb.Error, OSError) as e:  # the files are the truth; the index can be rebuilt
            print(
                terminal_safe(f"warning: index not updated ({e}); run `trace store reindex`"), file=sys.stderr
            )
            return False

    def repair_index(self) -> list[str]:
        """When a run was killed between committing an artifact and indexing it (a marker is left in
        STORE/.pending), bring the index in line with the manifests. Cheap when there is nothing to do (one
        directory listing). Returns the artifacts added to or dropped from the index."""
        marks = commit.pending(self.root)
        if not marks:
            return []
        from trace_cli.store import index

        fixed = index.sync(self) if self.index_path.exists() else []
        commit.clear_pending(marks)
        return fixed

    def reindex(self) -> dict[str, int]:
        from trace_cli.store import index

        marks = commit.pending(self.root)
        counts = index.rebuild(self)
        commit.clear_pending(marks)
        return counts

    def query(self, statement: str, params: list[Any] | None = None) -> tuple[list[str], list[tuple]]:
        """A read-only, confined query against the index (store/sql.py); returns (columns, rows)."""
        from trace_cli.store import sql

        return sql.query(self, statement, params)

    # ---------------------------------------------------------------- maintenance
    def verify(self) -> list[dict[str, Any]]:
        """Re-hash every file of every artifact and compare the index with the manifests; return one
        problem record per bad artifact."""
        from trace_cli.store import maintenance

        return maintenance.verify(self)

    def gc(
        self, *, min_age_s: float = 0.0, dry_run: bool = False, include_resumable: bool = False
    ) -> list[str]:
        """Remove leftovers of killed runs (see maintenance.gc); with `dry_run`, only list them."""
        from trace_cli.store import maintenance

        return maintenance.gc(self, min_age_s=min_age_s, dry_run=dry_run, include_resumable=include_resumable)
