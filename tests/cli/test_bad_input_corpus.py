"""The standing bad-input corpus (issue 14): every case runs the real `trace` in a subprocess with a timeout and
must exit 2 (a user mistake) with a message naming the file or field, never exit 0, an internal error, a
traceback or a hang, and must leave the store exactly as it was."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from bad_input_cases import CASES, make_files, tau2_file
from trace_testing import make_diagnosis, run_trace, snapshot, write_jsonl

from trace_cli.store import Store


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A store with a rollouts artifact `good`, a tiny model `tiny` and a diagnosis `diag` selecting
    precondition_verification; and a work directory with every bad file."""
    root = tmp_path_factory.mktemp("corpus")
    store, w = root / "store", root / "w"
    w.mkdir()
    good = write_jsonl(root / "seed.jsonl", [])
    from trace_testing import episode

    write_jsonl(good, [episode("g1"), episode("g2", reward=0.0)])
    for args in (
        ["ingest", "jsonl", good, "--name", "good"],
        ["model", "init", "--preset", "tiny", "--name", "tiny"],
    ):
        r = run_trace(*args, "--store", store, timeout=300)
        assert r.returncode == 0, r.stderr
    _diagnosis(Store(store))
    (model,) = Store(store).list(kind="model")
    make_files(w, model.path / "hf")
    return {"S": store, "W": w}


def _diagnosis(st: Store) -> None:
    make_diagnosis(st, ["precondition_verification"], rollouts="store://rollouts/good")


def _fill(s: str, world: dict[str, Path]) -> str:
    return (
        s.replace("{S}", str(world["S"])).replace("{W}", str(world["W"])).replace("{TAU2}", str(tau2_file()))
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, world):
    group, args, needles, code = CASES[case]
    store, w = world["S"], world["W"]
    argv = [_fill(a, world) for a in args]
    if "--store" not in argv and group != "validate":
        argv += ["--store", str(store)]
    before, work_before = snapshot(store), sorted(os.listdir(w))
    r = run_trace(*argv, cwd=w, timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == code, f"{case}: exit {r.returncode}\n{out[-3000:]}"
    assert "internal error" not in out and "Traceback" not in out, out[-3000:]
    for n in needles:
        assert _fill(n, world) in r.stderr, f"{case}: {_fill(n, world)!r} not in:\n{r.stderr[-3000:]}"
    assert snapshot(store) == before, f"{case}: the store changed"
    assert sorted(os.listdir(w)) == work_before, f"{case}: files appeared in the work directory"


def test_corpus_size_and_spread():
    by_group = collections.Counter(g for g, *_ in CASES.values())
    assert len(CASES) >= 60, by_group
    for group in (
        "ingest tau2", "ingest jsonl", "eval", "train", "synthesize", "diagnose", "model", "pretrain", "run",
        "status", "validate", "store sql", "store ls", "store verify", "store gc", "store reindex", "export",
        "serve", "compose",
    ):  # fmt: skip
        assert by_group[group] >= 1, group
    assert all(code == 2 for *_, code in CASES.values())
