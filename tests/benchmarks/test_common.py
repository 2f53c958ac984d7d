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


def test_a_stage_found_up_to_date_reports_the_wall_time_it_took_when_it_ran(tmp_path):
    """Stages keeps each artifact's wall time in the store, so a benchmark resumed on the same store (another
    session) reports what a reused stage cost, and says which labels were reused."""
    from common import Stages

    first = Stages(tmp_path / "store")
    assert first.settle("sft", "store://model/a", 812.4, skipped=False) == 812.4
    assert (
        first.settle("eval", "store://eval/b", 0.3, skipped=True) == 0.3
    )  # made before the log: as measured
    again = Stages(tmp_path / "store")
    assert again.settle("sft", "store://model/a", 0.2, skipped=True) == 812.4
    assert again.settle("eval", "store://eval/b", 0.1, skipped=True) == 0.1
    assert again.reused == ["sft"] and again.timings == {"sft": 812.4, "eval": 0.1} and first.reused == []
    rerun = Stages(tmp_path / "store")  # the stage ran again (its artifact deleted): the newest time wins
    rerun.settle("sft", "store://model/a", 700.0, skipped=False)
    assert Stages(tmp_path / "store").earlier_times() == {"store://model/a": 700.0}


def test_a_benchmark_refuses_a_trace_cli_other_than_the_checkouts(tmp_path, monkeypatch, capsys):
    """Benchmarks import trace_cli as the installed package (no sys.path insertion of the checkout); when
    `import trace_cli` would find another copy, or none, `common` exits 2 saying so, before anything runs."""
    import importlib.machinery
    import importlib.util

    import common
    import pytest

    other = tmp_path / "trace_cli" / "__init__.py"
    found = {"trace_cli": importlib.machinery.ModuleSpec("trace_cli", None, origin=str(other))}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found.get(name))
    with pytest.raises(SystemExit) as e:
        common._checkout_package()
    assert e.value.code == 2 and f"finds {other.parent}" in capsys.readouterr().err
    found.clear()
    with pytest.raises(SystemExit):
        common._checkout_package()
    monkeypatch.undo()
    common._checkout_package()  # the test run's own trace_cli is the checkout's
