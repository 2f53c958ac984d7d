"""The artifact store: atomic writes (temp dir -> rename -> manifest last), resolution, names, verify, gc."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trace_cli import __version__
from trace_cli.errors import NotFoundError, StoreError, UsageError
from trace_cli.store import layout
from trace_cli.store.hashing import artifact_id, sha256_file, sha256_json

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ID_RE = re.compile(r"^[0-9a-f]{4,16}$")


@dataclass(frozen=True)
class Artifact:
    """A committed artifact: a directory with a manifest."""

    kind: str
    id: str
    path: Path
    manifest: dict[str, Any]

    @property
    def digest(self) -> str:
        return self.manifest["digest"]

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest.get("config", {})

    @property
    def summary(self) -> dict[str, Any]:
        return self.manifest.get("summary", {})

    @property
    def uri(self) -> str:
        return f"{layout.URI_PREFIX}{self.kind}/{self.id}"

    def file(self, name: str) -> Path:
        return self.path / name

    def as_input(self, role: str) -> dict[str, Any]:
        return {"role": role, "id": self.id, "kind": self.kind, "digest": self.digest}


def file_input(role: str, path: str | Path) -> dict[str, Any]:
    """An input that is a plain file, identified by its content (not its path). A directory is identified by
    the relative paths and contents of all its files."""
    p = Path(path)
    if p.is_dir():
        import hashlib

        h = hashlib.sha256()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            h.update(f"{f.relative_to(p).as_posix()}\0{sha256_file(f)}\n".encode())
        return {"role": role, "path": str(p.resolve()), "digest": h.hexdigest()}
    if not p.is_file():
        raise NotFoundError(f"{p}: no such file")
    return {"role": role, "path": str(p.resolve()), "digest": sha256_file(p)}


@dataclass
class ArtifactWriter:
    """Collects the files of one artifact in a temp dir; `commit()` makes it visible atomically."""

    store: Store
    kind: str
    stage: str
    config: dict[str, Any]
    inputs: list[dict[str, Any]]
    id: str
    path: Path
    name: str | None = None
    overrides: list[dict[str, Any]] = field(default_factory=list)
    seed: int | None = None
    replace: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    artifact: Artifact | None = None

    def commit(self) -> Artifact:
        final = self.store.root / self.kind / self.id
        files = []
        for p in sorted(self.path.rglob("*")):
            if p.is_file():
                rel = p.relative_to(self.path).as_posix()
                if rel == layout.MANIFEST:
                    continue
                files.append({"path": rel, "sha256": sha256_file(p), "size": p.stat().st_size})
        manifest = {
            "kind": self.kind,
            "id": self.id,
            "schema_version": 1,
            "trace_cli_version": __version__,
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "stage": self.stage,
            "config": self.config,
            "config_digest": sha256_json(self.config),
            "overrides": self.overrides,
            "seed": self.seed,
            "inputs": self.inputs,
            "files": files,
            "digest": sha256_json([(f["path"], f["sha256"]) for f in files]),
            "summary": self.summary,
        }
        final.parent.mkdir(parents=True, exist_ok=True)
        if self.replace and final.exists():
            # --force: move the old artifact aside first, so a crash never leaves a half-replaced one
            old = self.store.tmp_root / f"replaced-{self.kind}-{self.id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        if (final / layout.MANIFEST).exists():
            # Same id = same stage, config and inputs: the existing artifact stands; drop ours.
            shutil.rmtree(self.path, ignore_errors=True)
            art = self.store.get(self.kind, self.id)
        else:
            if final.exists():  # half-written leftover of a killed run (no manifest): replace it
                shutil.rmtree(final)
            os.replace(self.path, final)
            tmp_manifest = final / (layout.MANIFEST + ".tmp")
            tmp_manifest.write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
            with open(tmp_manifest, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp_manifest, final / layout.MANIFEST)
            art = Artifact(self.kind, self.id, final, manifest)
        if self.name:
            self.store.set_name(self.kind, self.name, self.id)
        self.store.index_add(art)
        self.artifact = art
        return art


class Store:
    """A store root on disk. Cheap to construct; nothing is created until something is written."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else layout.default_store_root()
        self.root = self.root.resolve()

    # ---------------------------------------------------------------- paths
    @property
    def index_path(self) -> Path:
        return self.root / layout.INDEX

    @property
    def tmp_root(self) -> Path:
        return self.root / layout.TMP_DIR

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- writing
    @staticmethod
    def compute_id(stage: str, config: dict[str, Any], inputs: list[dict[str, Any]]) -> str:
        return artifact_id(stage, config, [f"{i['role']}:{i['digest']}" for i in inputs])

    @contextlib.contextmanager
    def writer(
        self,
        kind: str,
        stage: str,
        config: dict[str, Any],
        inputs: list[dict[str, Any]] | None = None,
        *,
        name: str | None = None,
        overrides: list[dict[str, Any]] | None = None,
        seed: int | None = None,
        id: str | None = None,
        replace: bool = False,
    ) -> Iterator[ArtifactWriter]:
        """Write an artifact: files go into `w.path`; on success it is committed, on error removed."""
        if kind not in layout.KINDS:
            raise UsageError(f"unknown artifact kind {kind!r}; expected one of {', '.join(layout.KINDS)}")
        if name is not None:
            self.check_name(name)
        inputs = list(inputs or [])
        aid = id or self.compute_id(stage, config, inputs)
        self.ensure()
        self.tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_root / f"{kind}-{aid}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        w = ArtifactWriter(
            self, kind, stage, config, inputs, aid, tmp, name, list(overrides or []), seed, replace
        )
        try:
            yield w
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        w.commit()

    # ---------------------------------------------------------------- names
    @staticmethod
    def check_name(name: str) -> None:
        if not _NAME_RE.match(name) or _ID_RE.match(name):
            raise UsageError(
                f"bad artifact name {name!r}: use letters, digits, '_', '-', '.', not starting with '.' or '-', "
                "and not something that looks like an id (4-16 hex characters)"
            )

    def set_name(self, kind: str, name: str, aid: str) -> None:
        self.check_name(name)
        d = self.root / layout.NAMES_DIR / kind
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        tmp.write_text(aid + "\n")
        os.replace(tmp, d / name)

    def names(self) -> list[tuple[str, str, str]]:
        """(kind, name, id) for every alias."""
        out = []
        base = self.root / layout.NAMES_DIR
        if base.is_dir():
            for kdir in sorted(base.iterdir()):
                if kdir.is_dir():
                    for f in sorted(kdir.iterdir()):
                        if f.is_file() and not f.name.startswith("."):
                            out.append((kdir.name, f.name, f.read_text().strip()))
        return out

    def names_of(self, kind: str, aid: str) -> list[str]:
        return [n for k, n, i in self.names() if k == kind and i == aid]

    # ---------------------------------------------------------------- reading
    def _load(self, kind: str, aid: str) -> Artifact | None:
        d = self.root / kind / aid
        m = d / layout.MANIFEST
        if not m.is_file():
            return None
        try:
            manifest = yaml.safe_load(m.read_text())
        except yaml.YAMLError as e:
            raise StoreError(f"{m}: unreadable manifest ({e}); run `trace store verify`") from e
        return Artifact(kind, aid, d, manifest)

    def exists(self, kind: str, aid: str) -> bool:
        return (self.root / kind / aid / layout.MANIFEST).is_file()

    def get(self, kind: str, aid: str) -> Artifact:
        art = self._load(kind, aid)
        if art is None:
            raise NotFoundError(f"no {kind} artifact {aid} in {self.root}")
        return art

    def list(self, kind: str | None = None) -> list[Artifact]:
        kinds = [kind] if kind else list(layout.KINDS)
        out: list[Artifact] = []
        for k in kinds:
            d = self.root / k
            if not d.is_dir():
                continue
            for sub in sorted(d.iterdir()):
                if sub.is_dir():
                    art = self._load(k, sub.name)
                    if art is not None:
                        out.append(art)
        out.sort(key=lambda a: (a.manifest.get("created_at", ""), a.kind, a.id))
        return out

    def resolve(self, ref: str, kind: str | None = None) -> Artifact:
        """Find an artifact by `store://KIND/NAME_OR_ID`, `KIND/NAME_OR_ID`, a name, an id or id prefix."""
        raw = ref
        if ref.startswith(layout.URI_PREFIX):
            ref = ref[len(layout.URI_PREFIX) :]
        want_kind = kind
        if "/" in ref:
            k, _, rest = ref.partition("/")
            if k not in layout.KINDS:
                raise NotFoundError(
                    f"{raw!r}: unknown artifact kind {k!r}; expected one of {', '.join(layout.KINDS)}"
                )
            if want_kind and k != want_kind:
                raise UsageError(f"{raw!r} is a {k} reference, but a {want_kind} artifact is needed here")
            want_kind, ref = k, rest
        kinds = [want_kind] if want_kind else list(layout.KINDS)
        # 1. names
        hits = [(k, i) for k, n, i in self.names() if n == ref and k in kinds]
        if len(hits) > 1:
            raise UsageError(
                f"name {ref!r} is ambiguous ({', '.join(k for k, _ in hits)}); use store://KIND/{ref}"
            )
        if hits:
            return self.get(*hits[0])
        # 2. ids and unique prefixes
        if _ID_RE.match(ref):
            cands = []
            for k in kinds:
                d = self.root / k
                if d.is_dir():
                    cands += [
                        (k, s.name) for s in d.iterdir() if s.name.startswith(ref) and self.exists(k, s.name)
                    ]
            if len(cands) == 1:
                return self.get(*cands[0])
            if len(cands) > 1:
                raise UsageError(f"id prefix {ref!r} is ambiguous: {', '.join(f'{k}/{i}' for k, i in cands)}")
        what = f"{want_kind} artifact" if want_kind else "artifact"
        raise NotFoundError(
            f"no {what} named or with id {ref!r} in store {self.root}", hint="see `trace store ls`"
        )

    # ---------------------------------------------------------------- maintenance
    def verify(self) -> list[dict[str, Any]]:
        """Re-hash every file of every artifact; return one problem record per bad artifact."""
        problems = []
        for art in self.list():
            issues = []
            listed = set()
            for f in art.manifest.get("files", []):
                listed.add(f["path"])
                p = art.path / f["path"]
                if not p.is_file():
                    issues.append(f"missing {f['path']}")
                elif p.stat().st_size != f["size"] or sha256_file(p) != f["sha256"]:
                    issues.append(f"changed {f['path']}")
            for p in art.path.rglob("*"):
                if p.is_file():
                    rel = p.relative_to(art.path).as_posix()
                    if rel != layout.MANIFEST and rel not in listed:
                        issues.append(f"unlisted {rel}")
            if issues:
                problems.append({"kind": art.kind, "id": art.id, "problems": issues})
        return problems

    def gc(
        self, *, min_age_s: float = 0.0, dry_run: bool = False, include_resumable: bool = False
    ) -> list[str]:
        """Remove half-written temp dirs, artifact dirs that never got a manifest, and index files of a
        killed `reindex`; with `dry_run`, only return what would be removed. Work dirs of interrupted
        training runs (marked RESUMABLE, continued by `trace train --resume`) are kept unless
        `include_resumable`, and never touched while their run holds its lock."""
        import time

        def drop(p: Path) -> None:
            if not dry_run:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(str(p))

        removed: list[str] = []
        now = time.time()
        if self.tmp_root.is_dir():
            for d in sorted(self.tmp_root.iterdir()):
                if now - d.stat().st_mtime < min_age_s:
                    continue
                if (d / RESUMABLE).is_file():
                    if _locked(d / ".lock") or not include_resumable:
                        continue
                pid = _pid_of(d.name)
                if pid is not None and pid != os.getpid() and _alive(pid) and min_age_s == 0:
                    # still being written by a live process; leave it
                    continue
                drop(d)
        for k in layout.KINDS:
            kd = self.root / k
            if kd.is_dir():
                for d in sorted(kd.iterdir()):
                    if d.is_dir() and not (d / layout.MANIFEST).exists():
                        drop(d)
        if self.root.is_dir():
            for f in sorted(
                self.root.glob(".index-*.duckdb*")
            ):  # .index-PID-HEX.duckdb[.wal], see index.rebuild
                parts = f.name.split("-")
                pid = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
                if pid is not None and pid != os.getpid() and _alive(pid):
                    continue
                drop(f)
        return removed

    # ---------------------------------------------------------------- index
    def index_add(self, art: Artifact) -> None:
        import duckdb

        from trace_cli.store import index

        try:
            index.add_artifact(self, art)
        except (StoreError, duckdb.Error) as e:  # the files are the truth; the index can be rebuilt
            print(f"warning: index not updated ({e}); run `trace store reindex`", file=sys.stderr)

    def reindex(self) -> dict[str, int]:
        from trace_cli.store import index

        return index.rebuild(self)


RESUMABLE = "RESUMABLE"  # marker file of a training work dir that `trace train --resume` can continue


def _locked(path: Path) -> bool:
    """True while another process holds the exclusive flock on `path` (a running training job)."""
    import fcntl

    if not path.is_file():
        return False
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def _pid_of(name: str) -> int | None:
    parts = name.split("-")
    if len(parts) >= 4 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); treat zombies as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
