"""The derived DuckDB index (reindex, plain duckdb CLI), `trace store verify/ls/show/sql`, and names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trace_testing import TAU2_FILES, episode, run_cli, run_trace, snapshot, write_jsonl

from trace_cli.stages import STAGES
from trace_cli.store import Store

QUERIES = [
    "select kind, id, stage, created_at, path, digest, config_digest, config, summary, n_files, bytes "
    "from artifacts order by kind, id",
    "select * from lineage order by all",
    "select * from names order by all",
    "select domain, count(*) as n, sum(reward) as r, count(*) filter (where success) as s, sum(n_turns) as turns, "
    "sum(n_tool_calls) as calls from episodes group by all order by all",
    "select artifact_id, episode_id, task_id, trial, length(messages) as m from episodes order by all",
    "select tool_name, requestor, count(*) as n, count(result) as with_result, count(*) filter (where error) as err "
    "from tool_calls group by all order by all",
    "select a.kind, a.id, l.parent_kind, l.parent_id, l.role from artifacts a join lineage l "
    "on a.kind = l.child_kind and a.id = l.child_id order by all",
]


@pytest.fixture
def populated(tau2_dir, tmp_path, monkeypatch) -> Path:
    """Two real τ² ingests, a JSONL ingest and a downstream `eval` artifact (artifact-to-artifact lineage)."""
    monkeypatch.setitem(STAGES, "count_episodes", "fixture_stages")
    store = tmp_path / "store"
    for domain in ("telecom", "airline"):
        r = run_cli("ingest", "tau2", tau2_dir / TAU2_FILES[domain], "--name", domain, "--store", store)
        assert r.exit_code == 0, r.output
    write_jsonl(tmp_path / "e.jsonl", [episode("e1"), episode("e2", reward=0.0)])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "kind": "recipe",
                "steps": [
                    {
                        "id": "mine",
                        "uses": "ingest",
                        "name": "mine",
                        "with": {"format": "jsonl", "path": "e.jsonl"},
                    },
                    {
                        "id": "count",
                        "uses": "count_episodes",
                        "name": "counted",
                        "with": {"rollouts": "${steps.mine.outputs.rollouts}"},
                    },
                ],
            }
        )
    )
    r = run_cli("run", recipe, "--store", store)
    assert r.exit_code == 0, r.output
    return store


def _all(store):
    out = []
    for q in QUERIES:
        r = run_cli("store", "sql", q, "--json", "--store", store)
        assert r.exit_code == 0, (q, r.output)
        out.append(json.loads(r.stdout))
    return out


def test_reindex_restores_identical_results(populated):
    before = _all(populated)
    assert len(before[0]) == 4 and len(before[2]) == 4
    by_name = {n["name"]: n["id"] for n in before[2]}
    # three ingests read files (lineage to a path), the eval artifact reads the `mine` rollouts
    assert sorted((x["kind"], x["parent_kind"], x["parent_id"], x["role"]) for x in before[6]) == [
        ("eval", "rollouts", by_name["mine"], "rollouts"),
        ("rollouts", None, None, "source_file"),
        ("rollouts", None, None, "source_file"),
        ("rollouts", None, None, "source_file"),
    ]
    assert sum(x["n"] for x in before[3]) == 20 + 20 + 2
    (populated / "index.duckdb").unlink()
    r = run_trace("store", "reindex", "--store", populated)
    assert r.returncode == 0, r.stderr
    assert "4 artifacts" in r.stdout and "4 names" in r.stdout
    assert _all(populated) == before
    # a missing index is rebuilt on the first query too
    (populated / "index.duckdb").unlink()
    assert _all(populated) == before
    # and reindexing an intact index changes nothing
    assert run_cli("store", "reindex", "--store", populated).exit_code == 0
    assert _all(populated) == before
    assert not list(populated.glob(".index-*"))


def _duckdb_cli(index: str, sql: str, *, cwd: Path, cmd: str | None = None) -> str:
    """The plain duckdb CLI on `index` (read-only, CSV without header); its stdout, stripped."""
    exe = Path(sys.executable).parent / "duckdb"
    args = [str(exe), "-readonly", index, "-csv", "-noheader"] + (["-cmd", cmd] if cmd else []) + ["-c", sql]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_index_opens_in_the_plain_duckdb_cli(populated):
    exe = Path(sys.executable).parent / "duckdb"
    if not exe.exists():
        pytest.skip(f"duckdb CLI not installed next to {sys.executable} (dev dependency duckdb-cli)")
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    print("duckdb CLI", version.stdout.strip())
    # The views name files relative to the store: run from the store, or tell DuckDB where it is.
    count = "select count(*) from episodes"
    assert _duckdb_cli("index.duckdb", count, cwd=populated) == "42"
    elsewhere = populated.parent
    idx = str(populated / "index.duckdb")
    assert _duckdb_cli(idx, count, cwd=elsewhere, cmd=f"SET file_search_path = '{populated}'") == "42"
    sql = (
        "select (select count(*) from artifacts), (select count(*) from tool_calls), "
        "(select count(*) from names), (select count(*) from tool_calls where requestor = 'user')"
    )
    assert _duckdb_cli("index.duckdb", sql, cwd=populated) == "4,365,4,125"


def test_verify_detects_changed_and_missing_files(populated):
    r = run_cli("store", "verify", "--store", populated)
    assert r.exit_code == 0, r.output
    assert "verified 4 artifacts: 0 with problems" in r.stdout
    st = Store(populated)
    tel, air = st.resolve("telecom"), st.resolve("airline")
    with open(tel.path / "tool_calls.parquet", "r+b") as fh:  # same size, one byte flipped
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 0xFF]))
    (air.path / "episodes.parquet").unlink()
    (air.path / "notes.txt").write_text("added by hand")
    r = run_trace("store", "verify", "--store", populated)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"rollouts/{tel.id}: changed tool_calls.parquet" in r.stdout
    assert f"rollouts/{air.id}: missing episodes.parquet; unlisted notes.txt" in r.stdout
    assert "verified 4 artifacts: 2 with problems" in r.stdout
    assert "error: 2 artifact(s) failed verification" in r.stderr
    r = run_cli("store", "verify", "--json", "--store", populated)
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["artifacts"] == 4
    assert {(p["id"], tuple(p["problems"])) for p in doc["problems"]} == {
        (tel.id, ("changed tool_calls.parquet",)),
        (air.id, ("missing episodes.parquet", "unlisted notes.txt")),
    }


def test_names(populated, tmp_path):
    st = Store(populated)
    tel = st.resolve("telecom")
    for ref in (
        "telecom",
        "store://rollouts/telecom",
        "rollouts/telecom",
        tel.id,
        tel.id[:8],
        f"store://rollouts/{tel.id}",
    ):
        r = run_cli("store", "show", ref, "--json", "--store", populated)
        assert r.exit_code == 0, (ref, r.output)
        doc = json.loads(r.stdout)
        assert (doc["id"], doc["names"]) == (tel.id, ["telecom"])
    # YAML output by default, the manifest validates against its schema
    r = run_cli("store", "show", "telecom", "--store", populated)
    assert r.exit_code == 0 and yaml.safe_load(r.stdout)["summary"]["episodes"] == 20
    assert run_cli("validate", tel.path / "manifest.yaml").exit_code == 0
    # a name is usable wherever an id is, e.g. as a stage input in a recipe
    recipe = tmp_path / "by_name.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "kind": "recipe",
                "steps": [
                    {"id": "c", "uses": "count_episodes", "with": {"rollouts": "store://rollouts/telecom"}}
                ],
            }
        )
    )
    r = run_cli("run", recipe, "--json", "--store", populated)
    assert r.exit_code == 0, r.output
    assert st.resolve(json.loads(r.stdout)["steps"][0]["id"]).manifest["inputs"][0]["id"] == tel.id
    ls = json.loads(run_cli("store", "ls", "--json", "--store", populated).stdout)
    assert {a["id"]: a["names"] for a in ls}[tel.id] == ["telecom"]
    assert [
        a["kind"]
        for a in json.loads(run_cli("store", "ls", "--kind", "eval", "--json", "--store", populated).stdout)
    ] == ["eval", "eval"]
    text = run_cli("store", "ls", "--store", populated).stdout
    assert "telecom" in text and "episodes=20" in text
    # a second alias for the same content (the ingest is skipped, the name is added)
    r = run_cli(
        "ingest", "tau2", tel.manifest["inputs"][0]["path"], "--name", "tel2", "--json", "--store", populated
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["skipped"] is True
    assert st.resolve("tel2").id == tel.id and sorted(st.names_of("rollouts", tel.id)) == ["tel2", "telecom"]
    # the same name on two kinds is ambiguous without the kind
    with st.writer("eval", "manual", {"x": 1}, name="telecom") as w:
        (w.path / "r.json").write_text("{}")
    r = run_cli("store", "show", "telecom", "--store", populated)
    assert r.exit_code == 2 and "name 'telecom' is ambiguous" in r.stderr
    assert (
        json.loads(run_cli("store", "show", "store://eval/telecom", "--json", "--store", populated).stdout)[
            "kind"
        ]
        == "eval"
    )
    _refused(
        populated,
        ("show", "nothing", "no artifact named or with id 'nothing'"),
        ("show", "store://widgets/x", "unknown artifact kind 'widgets'"),
        ("show", "store://eval/mine", "no eval artifact named or with id 'mine'"),
    )


def _refused(store, *cases: tuple[str, str, str]) -> None:
    """Each (`trace store` command, argument, message) exits 2 with the message on stderr."""
    for command, arg, msg in cases:
        r = run_cli("store", command, arg, "--store", store)
        assert r.exit_code == 2 and msg in r.stderr, r.output


@pytest.mark.parametrize("bad", ["-dash", ".hidden", "a/b", "has space", "deadbeef", "0123456789abcdef", "é"])
def test_bad_names_are_rejected(bad, tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_cli("ingest", "jsonl", f, "--store", store).exit_code == 0
    before = snapshot(store)
    r = run_cli(
        "ingest", "jsonl", write_jsonl(tmp_path / "f.jsonl", [episode("f1")]), "--name", bad, "--store", store
    )
    assert r.exit_code == 2, r.output
    assert f"bad artifact name {bad!r}" in r.stderr
    assert snapshot(store) == before


def test_sql_output_formats_and_errors(populated):
    q = "select domain, count(*) as n from episodes where domain is not null group by 1 order by 1"
    r = run_cli("store", "sql", q, "--csv", "--store", populated)
    assert r.exit_code == 0 and r.stdout.splitlines() == ["domain,n", "airline,20", "telecom,20"]
    r = run_cli("store", "sql", q, "--store", populated)
    assert r.exit_code == 0 and "airline" in r.stdout and "2 rows" in r.stderr
    before = snapshot(populated)
    _refused(
        populated,
        ("sql", "select nope from episodes", "SQL error"),
        ("sql", "drop table artifacts", "refused SQL statement"),
        ("sql", "select * from", "SQL error"),
    )
    assert snapshot(populated) == before
    r = run_cli("store", "sql", "select 1", "--store", populated.parent / "absent")
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_empty_store_views_are_typed(tmp_path):
    """A store with no rollouts still has queryable (empty) episodes/tool_calls views."""
    store = tmp_path / "store"
    with Store(store).writer("eval", "manual", {}) as w:
        (w.path / "r.json").write_text("{}")
    r = run_cli(
        "store", "sql", "select count(*) as n, sum(reward) as r from episodes", "--json", "--store", store
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [{"n": 0, "r": None}]
    r = run_cli(
        "store", "sql", "select count(*) as n from tool_calls where error", "--json", "--store", store
    )
    assert json.loads(r.stdout) == [{"n": 0}]
    assert json.loads(run_cli("store", "ls", "--json", "--store", tmp_path / "nothing").stdout) == []


def test_parallel_writers_into_a_fresh_store(tmp_path):
    """Four processes ingest at once into a store that does not exist yet: every artifact is committed and indexed."""
    files = [
        write_jsonl(tmp_path / f"f{i}.jsonl", [episode(f"e{i}-{j}") for j in range(5)]) for i in range(4)
    ]
    store = tmp_path / "store"
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    cmd = [sys.executable, "-m", "trace_cli", "ingest", "jsonl"]
    procs = [
        subprocess.Popen(
            cmd + [str(f), "--name", f"n{i}", "--store", str(store)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, f in enumerate(files)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "warning" not in err, err
    r = run_cli(
        "store",
        "sql",
        "select (select count(*) from episodes) as e, (select count(*) from artifacts) as a, "
        "(select count(*) from names) as n",
        "--json",
        "--store",
        store,
    )
    assert json.loads(r.stdout) == [{"e": 20, "a": 4, "n": 4}]
    assert not list(store.glob(".index-*"))


def test_reindex_ignores_a_stale_wal(populated):
    """A WAL left by a process killed while writing the old index must not be replayed onto the rebuilt one."""
    before = _all(populated)
    (populated / "index.duckdb.wal").write_bytes(b"\x00garbage from a killed writer" * 100)
    r = run_cli("store", "reindex", "--store", populated)
    assert r.exit_code == 0, r.output
    assert _all(populated) == before


def test_a_moved_store_needs_no_reindex(populated, tmp_path):
    """The index names files relative to the store: a moved store answers the same, paths included."""
    before = _all(populated)
    moved = tmp_path / "elsewhere" / "store"
    shutil.copytree(populated, moved)
    shutil.rmtree(populated)
    after = _all(moved)
    assert after == before
    assert all(not a["path"].startswith("/") for a in after[0])
    if (Path(sys.executable).parent / "duckdb").exists():  # the plain CLI, run from the store
        assert _duckdb_cli("index.duckdb", "select count(*) from episodes", cwd=moved) == "42"
    # and writing into the moved store keeps every artifact queryable
    f = write_jsonl(tmp_path / "more.jsonl", [episode("m1")])
    shutil.copytree(moved, tmp_path / "again")
    assert run_cli("ingest", "jsonl", f, "--store", tmp_path / "again").exit_code == 0
    r = run_cli("store", "sql", "select count(*) as n from episodes", "--json", "--store", tmp_path / "again")
    assert json.loads(r.stdout) == [{"n": 43}]


def test_copied_store_answers_from_its_own_files(populated, tmp_path):
    """A copy (and then a move of the original) answers the same queries without reindex, and reads only its
    own files: the original is moved away first, then the copy's episodes file is changed underneath it."""
    import shutil

    before = _all(populated)
    index_bytes = (populated / "index.duckdb").read_bytes()
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(populated, copy)
    populated.rename(tmp_path / "moved-away")
    assert (copy / "index.duckdb").read_bytes() == index_bytes  # nothing rebuilt it
    assert _all(copy) == before
    assert (copy / "index.duckdb").read_bytes() == index_bytes  # still not rebuilt by the queries
    # the copy's own files are what its views read: removing one of them shows in its answers
    shutil.rmtree(copy / "rollouts")
    r = run_cli("store", "sql", "select count(*) from episodes", "--store", copy)
    assert r.exit_code != 0 or "0" in r.output
