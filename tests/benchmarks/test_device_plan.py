"""benchmarks/device/plan.py: the device run's transfer plan, computed from the tree as it is, never a call over the
64 MiB a device call may carry (the tree plus what it carries)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

import pack  # noqa: E402
import plan  # noqa: E402

MIB = 1 << 20


def test_the_tree_is_measured_as_a_call_carries_it():
    """Tracked plus untracked-not-ignored files: at least every tracked file's bytes, and within the limit."""
    import subprocess

    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
    names = [n for n in tracked.stdout.decode().split("\0") if n]
    size = sum(
        (REPO / n).stat().st_size for n in names if (REPO / n).is_file() and not (REPO / n).is_symlink()
    )
    assert plan.tree_bytes() >= size > 0
    assert plan.tree_bytes() < plan.LIMIT  # the tree alone must travel


def test_weights_and_wheels_travel_in_calls_within_the_limit(tmp_path):
    """The real SmolLM2 GGUF split with pack.py and a wheel-sized load: every file in exactly one call, every call
    (tree + carry + headroom) within 64 MiB, and the run in the last call."""
    from trace_cli.models.importer import resolve_source

    gguf = resolve_source("smollm2-135m-instruct")["path"]
    tree = plan.tree_bytes()
    room = (plan.LIMIT - plan.MIB - tree) // MIB
    manifest = pack.split(gguf, tmp_path / "w", part_mib=min(40, room))
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name, mib in (("duckdb.whl", 24), ("transformers.whl", 13), ("trl.whl", 1)):
        (wheels / name).write_bytes(b"\0" * (mib * MIB))
    items = plan.items_of([tmp_path / "w", wheels])
    calls = plan.plan(tree, items)
    carried = sorted(f for c in calls for f, _ in c.files)
    assert carried == sorted(f for f, _ in items)
    for c in calls:
        assert tree + c.carry_bytes + plan.MIB <= 64 * MIB
    assert len(calls) >= 3  # ~98 MB of weights and ~38 MiB of wheels cannot share one call with the tree
    json.loads(manifest.read_text())
    cmds = plan.commands(calls, run="RUN")
    assert cmds[-1].endswith("RUN") and all("RUN" not in c for c in cmds[:-1])


def test_the_command_line_reports_the_calls_and_refuses_what_cannot_fit(tmp_path, capsys):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.part00").write_bytes(b"\0" * (5 * MIB))
    assert plan.main(["--parts", str(parts), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(c["total_mib"] <= 64 for c in doc["calls"]) and doc["calls"][-1]["command"].count(
        "gpu_chain.py"
    )
    (parts / "huge.part01").write_bytes(b"\0" * (64 * MIB))
    assert plan.main(["--parts", str(parts)]) == 1
    assert "huge.part01" in capsys.readouterr().err


def test_a_file_or_tree_over_the_limit_is_refused():
    with pytest.raises(plan.PlanError, match="split it"):
        plan.plan(30 * MIB, [("big.bin", 40 * MIB)])
    with pytest.raises(plan.PlanError, match="the tree alone"):
        plan.plan(64 * MIB, [])
    assert [c.files for c in plan.plan(10 * MIB, [])] == [[]]  # nothing to carry: one call, the run
