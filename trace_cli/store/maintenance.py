"""Store maintenance: `verify` (files against manifests, index against manifests) and `gc` (leftovers of
killed runs)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_cli.errors import StoreError, UsageError
from trace_cli.store import commit, index, layout
from trace_cli.store.artifacts import RESUMABLE, is_link, read_manifest
from trace_cli.store.hashing import sha256_file

if TYPE_CHECKING:
    # the artifacts side is all these functions use; the facade (which imports this module) is not needed
    from trace_cli.store.artifacts import Artifacts as Store

# A directory under STORE/KIND/ without a manifest is never a live commit (the manifest is inside the
# directory before it is renamed into place), so gc may remove it; the grace period is defence in depth
# against a writer of an older version that renamed first and wrote the manifest after.
GC_GRACE_S = 300.0


def _artifact_dirs(store: Store) -> list[tuple[str, Path]]:
    """The artifact directories (links skipped: never followed)."""
    out = []
    for k in layout.KINDS:
        kd = store.root / k
        if kd.is_dir() and not is_link(kd):
            out += [(k, d) for d in sorted(kd.iterdir()) if d.is_dir() and not is_link(d)]
    return out


def verify(store: Store) -> list[dict[str, Any]]:
    store.check_root(must_exist=True, links=False)
    links = store.links(deep=True)
    problems: list[dict[str, Any]] = [
        {
            "kind": "link",
            "id": p.relative_to(store.root).as_posix(),
            "problems": [
                "a symbolic link where the store's own directory or file should be (never followed)"
            ],
        }
        for p in links
    ]
    linked = set(links)
    committed: set[tuple[str, str]] = set()
    for kind, d in _artifact_dirs(store):
        m = d / layout.MANIFEST
        if m in linked or not m.is_file():
            continue  # a link (reported) or not an artifact (a leftover for gc)
        committed.add((kind, d.name))
        try:
            manifest = read_manifest(m, kind, d.name)
        except UsageError as e:
            problems.append({"kind": kind, "id": d.name, "problems": [e.message]})
            continue
        issues = []
        listed = set()
        inside = [Path(top) / n for top, dirs, files in os.walk(d) for n in dirs + files]
        bad = {p for p in inside if p in linked}
        for f in manifest["files"]:
            listed.add(f["path"])
            p = d / f["path"]
            if any(q in bad for q in (p, *p.parents)):
                continue  # reported as a link
            if not p.is_file():
                issues.append(f"missing {f['path']}")
            elif p.stat().st_size != f.get("size") or sha256_file(p) != f["sha256"]:
                issues.append(f"changed {f['path']}")
        for p in inside:
            if p.is_file() and p not in bad:
                rel = p.relative_to(d).as_posix()
                if rel != layout.MANIFEST and rel not in listed:
                    issues.append(f"unlisted {rel}")
        if issues:
            problems.append({"kind": kind, "id": d.name, "problems": issues})
    problems += _index_problems(store, committed)
    return problems


def _index_problems(store: Store, committed: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The index must list exactly the committed artifacts (it is derived from them)."""
    if not committed and not store.index_path.exists():
        return []
    fix = "run `trace store reindex`"
    if not store.index_path.exists():
        return [{"kind": "index", "id": layout.INDEX, "problems": [f"missing; {fix}"]}]
    try:
        indexed = index.indexed(store)
    except UsageError as e:
        return [{"kind": "index", "id": layout.INDEX, "problems": [e.message + f"; {fix}"]}]
    out = []
    for k, i in sorted(committed - indexed):
        out.append({"kind": k, "id": i, "problems": [f"committed but missing from the index; {fix}"]})
    for k, i in sorted(indexed - committed):
        out.append({"kind": k, "id": i, "problems": [f"in the index but has no manifest; {fix}"]})
    return out


def gc(
    store: Store, *, min_age_s: float = 0.0, dry_run: bool = False, include_resumable: bool = False
) -> list[str]:
    """Remove half-written temp dirs of dead writers, artifact dirs without a manifest (older than
    GC_GRACE_S), and index files of a killed `reindex`. Work dirs of interrupted training runs (marked
    RESUMABLE, continued by `trace train --resume`) are kept unless `include_resumable`, and never touched
    while their run holds its lock."""
    store.check_root(must_exist=True)
    found: list[Path] = []
    drop = found.append

    now = time.time()
    if store.tmp_root.is_dir():
        for d in sorted(store.tmp_root.iterdir()):
            try:
                age = now - d.lstat().st_mtime
            except FileNotFoundError:  # its writer just committed or cleaned it up
                continue
            if age < min_age_s:
                continue
            if (d / RESUMABLE).is_file():
                if commit.locked(d / ".lock") or not include_resumable:
                    continue
            pid = commit.pid_of(d.name)
            if pid is not None and pid != os.getpid() and commit.alive(pid) and min_age_s == 0:
                continue  # still being written by a live process
            drop(d)
    for _kind, d in _artifact_dirs(store):
        try:
            if (d / layout.MANIFEST).exists() or now - d.lstat().st_mtime < max(GC_GRACE_S, min_age_s):
                continue
        except FileNotFoundError:
            continue
        drop(d)
    if store.root.is_dir():
        for f in sorted(
            store.root.glob(".index-*.duckdb*")
        ):  # .index-PID-HEX.duckdb[.wal], see index.rebuild
            parts = f.name.split("-")
            pid = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
            if pid is not None and pid != os.getpid() and commit.alive(pid):
                continue
            drop(f)
    if dry_run or not found:
        return [str(p) for p in found]
    return _remove(store, found)


def _rmtree(p: Path) -> list[OSError]:
    """shutil.rmtree that goes on past errors and returns them (instead of ignoring them)."""
    errors: list[OSError] = []
    if sys.version_info >= (3, 12):
        shutil.rmtree(p, onexc=lambda _f, _p, e: errors.append(e))
    else:
        shutil.rmtree(p, onerror=lambda _f, _p, info: errors.append(info[1]))
    return errors


def _remove(store: Store, found: list[Path]) -> list[str]:
    """Remove `found`; nothing at all when the store cannot be written (a read-only mount or permissions):
    UsageError (exit 2) then, rather than claiming a removal that did not happen."""
    blocked = sorted({str(p.parent) for p in found if not os.access(p.parent, os.W_OK | os.X_OK)})
    if blocked:
        raise UsageError(
            f"store {store.root} is read-only here: gc cannot remove its {len(found)} leftover(s) "
            f"(no write access to {blocked[0]}); nothing was removed",
            hint="run `trace store gc` where the store is writable; `trace store gc --dry-run` lists them",
        )
    removed: list[str] = []
    failed: list[str] = []
    for p in found:
        errors: list[OSError] = []
        try:
            if p.is_dir() and not p.is_symlink():
                errors += _rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:  # removed meanwhile (its writer cleaned up, or another gc)
            pass
        except OSError as e:
            errors.append(e)
        errors = [e for e in errors if not isinstance(e, FileNotFoundError)]
        if errors or p.exists():
            failed.append(f"{p} ({errors[0].strerror if errors and errors[0].strerror else 'still there'})")
        else:
            removed.append(str(p))
    if failed:
        raise StoreError(
            f"gc removed {len(removed)} leftover(s) but could not remove {len(failed)}: "
            + "; ".join(failed[:3])
        )
    return removed
