"""The results files: the result JSON (`benchmarks/schemas/sample_efficiency.schema.json`) and, while a run is
under way, OUT.partial.json (`sample_efficiency_partial.schema.json`), each checked against its schema when it
is written and when it is read; `--combine` of several result files; the commit and dirty flag of a run."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

from common import REPO, command, git_commit, git_dirty, write_result

SCHEMAS = REPO / "benchmarks" / "schemas"
RESULT, PARTIAL = "sample_efficiency", "sample_efficiency_partial"


class Refused(Exception):
    """Input the benchmark will not use (a file that is not a result, results of a dirty checkout): exit 2."""


@cache
def validator(name: str):
    import jsonschema

    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def problem(doc: Any, name: str) -> str | None:
    """The first way `doc` breaks schema `name` (its path and message), None when it conforms."""
    err = next(iter(sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path) or "(top)"
    return f"{where}: {err.message[:300]}"


def write(path: Path, doc: dict[str, Any], name: str = RESULT) -> Path:
    """Write `doc` after checking it against its schema (a document that breaks it is a bug: ValueError)."""
    doc = json.loads(json.dumps(doc, default=str))  # what the file will hold
    bad = problem(doc, name)
    if bad:
        raise ValueError(f"{path}: the {name} document breaks its schema: {bad}")
    return write_result(path, doc)


def read(path: Path, name: str = RESULT) -> dict[str, Any]:
    """A results file, checked against its schema (Refused with the reason otherwise)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: not readable JSON ({e})") from None
    bad = problem(doc, name)
    if bad:
        raise Refused(f"{path}: not a {name} file ({SCHEMAS.name}/{name}.schema.json: {bad})")
    return doc


def combine(paths: list[Path]) -> dict[str, Any]:
    """The runs of several result files (per target, training seed or method: same settings and test seeds);
    rows of one (target, budget, seed) from different files (e.g. --methods grpo_target and trace) are merged,
    each keeping the commit and dirty flag of the files it came from (`sources`). Refused: a file that is not a
    result, files of different experiments, and a run from a dirty checkout or one that does not say."""
    docs = [read(p) for p in paths]
    for p, d in zip(paths, docs, strict=True):
        if d.get("dirty") is not False:
            why = "a dirty checkout" if d.get("dirty") else "a checkout whose state it does not record"
            raise Refused(f"--combine: {p} is the result of {why} (commit {d.get('commit')}): not combined")
    for key in ("held_out", "settings", "lr_sweep", "preregistration"):
        if any(d.get(key) != docs[0].get(key) for d in docs):
            raise Refused(f"--combine: {key} differs between the result files; they are not one experiment")
    sources = [
        {
            "file": str(p),
            "commit": d["commit"],
            "dirty": d["dirty"],
            "command": d.get("command"),
            "train_seeds": d["train_seeds"],
            "methods": d.get("methods"),
        }
        for p, d in zip(paths, docs, strict=True)
    ]
    merged: dict[tuple, dict[str, Any]] = {}
    for src, d in zip(sources, docs, strict=True):
        for r in d["runs"]:
            row = merged.setdefault((r.get("target", "shop"), r["budget"], r["seed"]), {"sources": []})
            row.update({k: v for k, v in r.items() if k != "sources"})
            row["sources"].append({k: src[k] for k in ("file", "commit", "dirty")})
    restarts = [r for d in docs for r in d.get("restarts") or ()]  # every file's, in the order given
    return {
        "runs": list(merged.values()),
        "meta": {
            "commit": docs[0]["commit"],
            "dirty": False,
            "commits": sorted({str(d["commit"]) for d in docs}),
            # the checkout that combined them (`commit` is the first file's run's): what code did the combining
            "combined_by": {"commit": git_commit(), "dirty": git_dirty(), "at": now()},
            "sources": sources,
            "command": command(),
            "quick": docs[0].get("quick"),
            "held_out": docs[0]["held_out"],
            "train_seeds": sorted({s for d in docs for s in d["train_seeds"]}),
            "methods": sorted({m for d in docs for m in d.get("methods") or ()}),
            "settings": docs[0]["settings"],
            "store": [d.get("store") for d in docs],
            **{k: docs[0][k] for k in ("lr_sweep", "preregistration") if docs[0].get(k)},
            **({"restarts": restarts} if restarts else {}),
        },
        "wall_s": [d.get("wall_s") for d in docs],
        "timings_s": {str(p): d.get("timings_s") for p, d in zip(paths, docs, strict=True)},
    }


def now() -> str:
    """UTC now, to the second (ISO 8601)."""
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Progress:
    """OUT.partial.json: the finished units ([target, seed, method]) and their rows, written after each unit,
    so a stopped run started again with the same command and --out resumes where it stopped (the GRPO run it
    was in resumes from its last checkpoint in the store). A partial file of another commit, another checkout
    state (clean or dirty) or other settings is not resumed from (the run starts over; the store still skips
    what it holds). A dirty run resumes, but its result stays dirty: --combine refuses it.

    Every start that finds a partial file is a restart and is logged (`restarts`, in the partial file and then
    in the result, kept by --combine): when, at which commit, whether it resumed, how many units were done,
    and `reason` (--restart-reason; "not given" otherwise). Earlier restarts of the partial file are kept."""

    def __init__(self, path: Path, meta: dict[str, Any], restart_reason: str | None = None):
        self.path, self.meta = path, meta
        self.done: dict[tuple[str, int, str], dict[int, dict[str, Any]]] = {}
        self.restart_reason = restart_reason
        if path.is_file():
            self._load()

    def _restart(self, earlier: list[dict[str, Any]], resumed: bool, why: str | None = None) -> None:
        entry = {
            "at": now(),
            "commit": self.meta.get("commit"),
            "reason": self.restart_reason or "not given",
            "resumed": resumed,
            "units_done": len(self.done),
            **({"not_resumed_because": why} if why else {}),
        }
        self.meta["restarts"] = [*earlier, entry]
        self._write()  # the restart is on record before any work

    def _load(self) -> None:
        try:
            doc = read(self.path, PARTIAL)
        except Refused as e:
            print(f"not resuming: {e}", file=sys.stderr)
            self._restart([], False, str(e)[:300])
            return
        earlier = list(doc.get("restarts") or ())
        keys = ("commit", "dirty", "held_out", "settings", "targets_run")
        if any(doc[k] != self.meta[k] for k in keys):
            print(
                f"not resuming from {self.path}: another commit, checkout state or settings", file=sys.stderr
            )
            off = [k for k in keys if doc[k] != self.meta[k]]
            self._restart(earlier, False, f"the partial file's {', '.join(off)} differ")
            return
        for target, seed, method in doc["done"]:
            rows = [
                r for r in doc["runs"] if (r["target"], r["seed"], r.get("method")) == (target, seed, method)
            ]
            self.done[(target, seed, method)] = {r["budget"]: r["row"] for r in rows}
        print(f"resuming from {self.path}: {len(self.done)} unit(s) done", file=sys.stderr)
        self._restart(earlier, True)

    def unit(self, target: str, seed: int, method: str, compute, *args) -> dict[int, dict[str, Any]]:
        """The rows (per budget) of one unit: from the partial file when it is done there, else compute(*args)
        and record them."""
        key = (target, seed, method)
        if key in self.done:
            print(f"{target}/{method}/{seed}: done in {self.path.name}, not run again", file=sys.stderr)
            return self.done[key]
        self.done[key] = compute(*args)
        self._write()
        return self.done[key]

    def _write(self) -> None:
        runs = [
            {"target": t, "seed": s, "method": m, "budget": b, "row": row}
            for (t, s, m), rows in self.done.items()
            for b, row in rows.items()
        ]
        write(self.path, {**self.meta, "done": [list(k) for k in self.done], "runs": runs}, PARTIAL)

    def finished(self) -> None:
        self.path.unlink(missing_ok=True)
