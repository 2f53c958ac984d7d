"""Untrusted text never reaches the terminal raw (issue 46, item 5): ingested data shown by `store sql`, a
path on the command line, a file name in a store; control characters (ESC, CR, BEL, C1) come out escaped,
the way ingest already quotes values, and rich markup in a cell is shown as text."""

from __future__ import annotations

from trace_testing import episode, run_trace, write_jsonl

EVIL = "\x1b]0;pwned\x07\x1b]52;c;ZWNobyBoaQ==\x07\rok\x9b31m[bold red]x[/]"


def _clean(text: str) -> None:
    for c in ("\x1b", "\r", "\x07", "\x9b"):
        assert c not in text, repr(text)


def test_store_sql_escapes_cells_in_every_format(tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1", task_id=EVIL)])
    r = run_trace("ingest", "jsonl", f, "--store", store)
    assert r.returncode == 0, r.stderr
    q = "SELECT task_id FROM episodes"
    table = run_trace("store", "sql", q, "--store", store)
    assert table.returncode == 0, table.stderr
    _clean(table.stdout + table.stderr)
    assert "\\x1b]0;pwned" in table.stdout and "[bold red]x[/]" in table.stdout, table.stdout
    csv = run_trace("store", "sql", q, "--csv", "--store", store)
    assert csv.returncode == 0, csv.stderr
    _clean(csv.stdout.replace("\r\n", "\n") + csv.stderr)
    assert "\\x1b]0;pwned" in csv.stdout


def test_a_path_with_control_characters_is_escaped_in_errors(tmp_path):
    bad = tmp_path / "x\x1b]0;pwned\x07.jsonl"
    r = run_trace("ingest", "jsonl", bad, "--store", tmp_path / "store")
    assert r.returncode == 2, r.stderr
    _clean(r.stdout + r.stderr)
    assert "pwned" in r.stderr


def test_store_verify_escapes_file_names(tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_trace("ingest", "jsonl", f, "--store", store).returncode == 0
    art = next(p for p in (store / "rollouts").iterdir() if p.is_dir())
    (art / "x\x1b]0;pwned\x07").write_text("extra")
    r = run_trace("store", "verify", "--store", store)
    assert r.returncode == 1, r.stderr
    _clean(r.stdout + r.stderr)
    assert "pwned" in r.stdout


def test_store_gc_escapes_the_names_it_removes(tmp_path):
    store = tmp_path / "store"
    f = write_jsonl(tmp_path / "e.jsonl", [episode("e1")])
    assert run_trace("ingest", "jsonl", f, "--store", store).returncode == 0
    (store / ".tmp").mkdir(exist_ok=True)
    (store / ".tmp" / "x\x1b]0;pwned\x07").mkdir()
    for args in (("--dry-run",), ()):
        r = run_trace("store", "gc", *args, "--store", store)
        assert r.returncode == 0, r.stderr
        _clean(r.stdout + r.stderr)
        assert "\\x1b]0;pwned" in r.stdout, r.stdout
