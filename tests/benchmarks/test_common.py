"""What every benchmark result carries, whichever benchmark wrote it."""

from __future__ import annotations

import json
import subprocess

from common import REPO, write_result


def test_every_result_names_its_commit_and_whether_the_tree_was_dirty(tmp_path):
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    doc = json.loads(write_result(tmp_path / "r.json", {"command": "python x.py", "rows": []}).read_text())
    assert doc["commit"] == head and isinstance(doc["dirty"], bool) and doc["rows"] == []
    # a result that states its own provenance (a combined file) keeps it
    kept = json.loads(write_result(tmp_path / "c.json", {"commit": "abc", "dirty": False}).read_text())
    assert kept["commit"] == "abc" and kept["dirty"] is False


def test_a_result_names_the_checkout_it_started_from(tmp_path, monkeypatch):
    """A long benchmark records the commit it started at; if the tree changes while it runs (a commit, an edit),
    the result says so with the commit and dirty flag at writing."""
    import common

    start = common.at_start()
    doc = json.loads(write_result(tmp_path / "a.json", {"rows": []}).read_text())
    assert (doc["commit"], doc["dirty"]) == (
        start["commit"],
        start["dirty"],
    ) and "tree_changed_during_run" not in doc
    monkeypatch.setattr(common, "git_commit", lambda: "f" * 40)
    moved = json.loads(write_result(tmp_path / "b.json", {"rows": []}).read_text())
    assert moved["commit"] == start["commit"] and moved["tree_changed_during_run"]["commit"] == "f" * 40
