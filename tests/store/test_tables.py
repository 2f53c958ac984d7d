"""store/tables.py: every Parquet table is static data of the store, so the index knows each view without
importing the stages that write them (the store is the floor)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_cli.store import Store, layout
from trace_cli.store.tables import EVAL_RESULTS, TABLES, TableSpec

DUCK = {"string": "VARCHAR", "bool": "BOOLEAN", "int32": "INTEGER", "int64": "BIGINT", "float64": "DOUBLE"}


def test_specs_are_consistent():
    assert len({(t.kind, t.file, t.view) for t in TABLES.values()}) == len(TABLES)
    files = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    for view, t in TABLES.items():
        assert t.view == view and t.kind in layout.KINDS and t.file in files, t
        assert t.schema.names == t.names and len(set(t.names)) == len(t.names), t.view


def test_column_groups_share_a_type_and_bad_groups_are_errors():
    t = TableSpec("v", "eval", "f.parquet", "a b: string, n: int32, x y z: float64, ok: bool")
    assert t.schema == pa.schema(
        [("a", pa.string()), ("b", pa.string()), ("n", pa.int32())]
        + [(c, pa.float64()) for c in "xyz"]
        + [("ok", pa.bool_())]
    )
    for bad in ("a: text", ": string", "a b"):
        with pytest.raises(ValueError, match="bad column group"):
            TableSpec("v", "eval", "f.parquet", bad)


def test_write_uses_the_spec_schema(tmp_path):
    row = {"task_id": "t", "task_family": "f", "seed": 3, "trials": 2, "successes": 1, "mean_reward": 0.5}
    path = EVAL_RESULTS.write([{**row, "pass_hat_k": "{}"}], tmp_path)
    assert path == tmp_path / layout.EVAL_RESULTS
    assert pq.read_schema(path).remove_metadata() == EVAL_RESULTS.schema


def test_a_fresh_index_has_every_view_typed_and_empty(tmp_path):
    st = Store(tmp_path / "store")
    st.ensure()
    st.reindex()
    for t in TABLES.values():
        cols, rows = st.query(f"DESCRIBE {t.view}")
        types = {r[0]: r[1] for r in rows}
        assert list(types) == [*t.names, "artifact_id"], t.view
        assert [types[n] for n, _ in t.fields] == [DUCK[k] for _, k in t.fields], t.view
        assert st.query(f"SELECT count(*) FROM {t.view}")[1] == [(0,)]
    assert types  # (the loop ran)


def test_reindex_imports_no_stage():
    """`trace store reindex` builds every view from the store alone."""
    code = (
        "import sys, tempfile\n"
        "from trace_cli.store import Store\n"
        "st = Store(tempfile.mkdtemp()); st.ensure(); st.reindex()\n"
        "print(sorted(m for m in sys.modules if m.startswith('trace_cli.') and not m.startswith(("
        "'trace_cli.store', 'trace_cli.config', 'trace_cli.errors'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
