"""Long work reports progress as plain lines on stderr when it is not a terminal (CI, nohup, SLURM)."""

from __future__ import annotations

import re

from trace_testing import run_trace


def reference_eval(seeds: str, store, env: dict[str, str], *extra: str):
    """`trace eval` of the reference policy on shop in a subprocess whose stderr is a pipe."""
    return run_trace(
        "eval",
        "--model",
        "policy:reference",
        "--env",
        "shop",
        "--seeds",
        seeds,
        *extra,
        "--store",
        store,
        env=env,
    )


def test_eval_prints_progress_lines_when_stderr_is_a_file(tmp_path):
    every = {"TRACE_NO_PROGRESS": "", "TRACE_PROGRESS_INTERVAL": "0"}
    r = reference_eval("0:40", tmp_path / "s", every, "--batch-size", "8")
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"^.*: (\d+)/40 \((\d+)%\), \d+ s elapsed, (~\d+ s left|done)$", r.stderr, re.M)
    assert len(lines) >= 3, r.stderr  # one per batch of 8, and a closing one
    done = [int(n) for n, _, _ in lines]
    assert done == sorted(done) and done[-1] == 40 and lines[-1][2] == "done"


def test_no_progress_lines_when_turned_off_or_work_is_short(tmp_path):
    quiet = reference_eval("0:16", tmp_path / "a", {"TRACE_NO_PROGRESS": "1", "TRACE_PROGRESS_INTERVAL": "0"})
    # the default interval (30 s) is longer than this run: no line at all
    short = reference_eval("0:16", tmp_path / "b", {"TRACE_NO_PROGRESS": ""})
    for r in (quiet, short):
        assert r.returncode == 0, r.stderr
        assert not re.search(r"\d+/16 \(", r.stderr), r.stderr
