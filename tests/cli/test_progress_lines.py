"""Long work reports progress as plain lines on stderr when it is not a terminal (CI, nohup, SLURM)."""

from __future__ import annotations

import re

from trace_testing import run_trace


def test_eval_prints_progress_lines_when_stderr_is_a_file(tmp_path):
    r = run_trace(
        "eval",
        "--model",
        "policy:reference",
        "--env",
        "shop",
        "--seeds",
        "0:40",
        "--batch-size",
        "8",
        "--store",
        tmp_path / "s",
        env={"TRACE_NO_PROGRESS": "", "TRACE_PROGRESS_INTERVAL": "0"},
    )
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"^.*: (\d+)/40 \((\d+)%\), \d+ s elapsed, (~\d+ s left|done)$", r.stderr, re.M)
    assert len(lines) >= 3, r.stderr  # one per batch of 8, and a closing one
    done = [int(n) for n, _, _ in lines]
    assert done == sorted(done) and done[-1] == 40 and lines[-1][2] == "done"


def test_no_progress_lines_when_turned_off_or_work_is_short(tmp_path):
    quiet = run_trace(
        "eval",
        "--model",
        "policy:reference",
        "--env",
        "shop",
        "--seeds",
        "0:16",
        "--store",
        tmp_path / "a",
        env={"TRACE_NO_PROGRESS": "1", "TRACE_PROGRESS_INTERVAL": "0"},
    )
    short = run_trace(  # the default interval (30 s) is longer than this run: no line at all
        "eval",
        "--model",
        "policy:reference",
        "--env",
        "shop",
        "--seeds",
        "0:16",
        "--store",
        tmp_path / "b",
        env={"TRACE_NO_PROGRESS": ""},
    )
    for r in (quiet, short):
        assert r.returncode == 0, r.stderr
        assert not re.search(r"\d+/16 \(", r.stderr), r.stderr
