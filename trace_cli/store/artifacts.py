"""The artifacts of a store root on disk: atomic writes (temp dir -> rename -> manifest last), resolution, names.

Nothing here knows the index: after each commit the writer calls `Artifacts.after_commit`, which the `Store`
facade (store/facade.py) fills in with the index update, so this module and store/index.py never import each
other."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli import __version__
from trace_cli.errors import NotFoundError, UsageError, a, shown
from trace_cli.store import commit, layout
from trace_cli.store.hashing import artifact_id, sha256_file, sha256_json

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ID_RE = re.compile(r"^[0-9a-f]{4,16}$")


_LINK_HINT = (
    "a store never follows a link out of itself (a store handed over by someone else may be crafted): "
    "replace the link by the directory or file it stands for, or remove it; `trace store verify` lists "
    "every link in the store"
)


def is_link(path: Path) -> bool:
    """Whether `path` itself is a symbolic link (never followed); False when it does not exist."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def refuse_link(path: Path) -> None:
    """UsageError (exit 2) naming `path` when it is a symbolic link; nothing of its target is read."""
    if is_link(path):
        raise UsageError(
            f"{shown(str(path))} is a symbolic link; the store does not follow it", hint=_LINK_HINT
        )


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
        """The path of one of the artifact's files; UsageError when it (or a folder on the way) is a link."""
        p = self.path / name
        for q in [p, *p.relative_to(self.path).parents[:-1]]:
            refuse_link(q if q is p else self.path / q)
        return p

    def as_input(self, role: str) -> dict[str, Any]:
        return {"role": role, "id": self.id, "kind": self.kind, "digest": self.digest}


def file_input(role: str, path: str | Path) -> dict[str, Any]:
    """An input that is a plain file, identified by its content (not its path). A directory is identified by
    the relative paths and contents of all its files."""
    import stat

    from trace_cli.config.loading import check_input_file

    p = Path(path)
    if stat.S_ISDIR(check_input_file(p, expected="an input file", allow_dir=True).st_mode):
        import hashlib

        h = hashlib.sha256()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            h.update(f"{f.relative_to(p).as_posix()}\0{sha256_file(f)}\n".encode())
        return {"role": role, "path": str(p.resolve()), "digest": h.hexdigest()}
    return {"role": role, "path": str(p.resolve()), "digest": sha256_file(p)}


@dataclass
class ArtifactWriter:
    """Collects the files of one artifact in a temp dir; `commit()` makes it visible atomically."""

    store: Artifacts
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
        # The manifest goes into the temp dir first: one rename then makes the artifact visible complete, so
        # a directory under STORE/KIND/ without a manifest is never a live commit (gc may remove it).
        commit.write_manifest(self.path / layout.MANIFEST, manifest)
        refuse_link(final.parent)
        final.parent.mkdir(parents=True, exist_ok=True)
        refuse_link(final)
        marker = commit.mark_pending(self.store.root, self.kind, self.id)
        if (final / layout.MANIFEST).exists() and self.replace:
            commit.replace_dir(self.path, final)  # --force: readers never find a file missing
            art = Artifact(self.kind, self.id, final, manifest)
        elif (final / layout.MANIFEST).exists():
            # Same id = same stage, config and inputs: the existing artifact stands; drop ours.
            shutil.rmtree(self.path, ignore_errors=True)
            art = self.store.get(self.kind, self.id)
        else:
            if final.exists():  # a leftover without a manifest (an older version's killed commit): set aside
                aside = (
                    self.store.tmp_root
                    / f"leftover-{self.kind}-{self.id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                )
                with contextlib.suppress(FileNotFoundError):
                    os.replace(final, aside)
                shutil.rmtree(aside, ignore_errors=True)
            try:
                os.replace(self.path, final)
                art = Artifact(self.kind, self.id, final, manifest)
            except OSError as e:  # another process committed the same id in between: theirs stands
                if not (final / layout.MANIFEST).exists():
                    raise
                shutil.rmtree(self.path, ignore_errors=True)
                art = self.store.get(self.kind, self.id)
                del e  # (not chained: the existing artifact is the result)
            commit.fsync_dir(final.parent)
        if self.name:
            self.store.set_name(self.kind, self.name, self.id)
        if self.store.after_commit(art):
            marker.unlink(missing_ok=True)  # else it stays: the next command repairs the index
        self.artifact = art
        return art


_MANIFEST_KEYS = {"kind": str, "id": str, "digest": str, "files": list}


def read_manifest(path: Path, kind: str | None = None, aid: str | None = None) -> dict[str, Any]:
    """Load and sanity-check a manifest; UsageError (exit 2) naming the file and the way out when it is
    malformed (the artifact's files are then of unknown integrity)."""
    import yaml

    from trace_cli.config import safe_yaml

    fix = (
        "the artifact is damaged: restore the directory from a backup, or delete it and rerun the step that "
        "made it, then run `trace store reindex`; `trace store verify` lists every damaged artifact"
    )
    try:
        doc = safe_yaml.load(path.read_bytes())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: malformed manifest ({str(e).splitlines()[0]})", hint=fix) from e
    except OSError as e:
        raise UsageError(f"{path}: cannot read manifest ({e.strerror})", hint=fix) from e
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: malformed manifest (not a mapping)", hint=fix)
    bad = [k for k, t in _MANIFEST_KEYS.items() if not isinstance(doc.get(k), t)]
    if bad:
        raise UsageError(f"{path}: malformed manifest (missing or mistyped: {', '.join(bad)})", hint=fix)
    if (kind is not None and doc["kind"] != kind) or (aid is not None and doc["id"] != aid):
        raise UsageError(
            f"{path}: manifest says {doc['kind']}/{doc['id']}, but it lies in {kind}/{aid}", hint=fix
        )
    for f in doc["files"]:
        if not (isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str)):
            raise UsageError(f"{path}: malformed manifest (a `files` entry lacks path/sha256)", hint=fix)
    return doc


class Artifacts:
    """The artifact directories of a store root. Cheap to construct; nothing is created until something is
    written. Use the `Store` facade (trace_cli.store.Store), which also keeps the index."""

    def __init__(self, root: str | Path | None = None, *, origin: str | None = None):
        self.root = Path(root) if root is not None else layout.default_store_root()
        self.root = self.root.resolve()
        self.origin = origin  # where the path came from (--store, $TRACE_STORE), for error messages

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
        self.check_root()
        tmp = self.tmp_root / f"{kind}-{aid}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.tmp_root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            (tmp / ".probe").touch()  # catches a read-only store before any work is done
            (tmp / ".probe").unlink()
        except OSError as e:
            origin = f" (from {self.origin})" if self.origin else ""
            raise UsageError(
                f"store {self.root}{origin} is not writable: {e.strerror}: {e.filename}",
                hint="fix its permissions, or choose another store with --store or $TRACE_STORE",
            ) from e
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
        refuse_link(d.parent)
        refuse_link(d)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        tmp.write_text(aid + "\n")
        os.replace(tmp, d / name)

    def names(self) -> list[tuple[str, str, str]]:
        """(kind, name, id) for every alias."""
        out = []
        base = self.root / layout.NAMES_DIR
        refuse_link(base)
        if base.is_dir():
            for kdir in sorted(base.iterdir()):
                refuse_link(kdir)
                if kdir.is_dir():
                    for f in sorted(kdir.iterdir()):
                        if not f.name.startswith("."):
                            aid = _read_name(f)
                            if aid is not None:
                                out.append((kdir.name, f.name, aid))
        return out

    def names_of(self, kind: str, aid: str) -> list[str]:
        return [n for k, n, i in self.names() if k == kind and i == aid]

    # ---------------------------------------------------------------- reading
    def _load(self, kind: str, aid: str) -> Artifact | None:
        d = self.root / kind / aid
        m = d / layout.MANIFEST
        for p in (self.root / kind, d, m):
            refuse_link(p)
        if not m.is_file():
            return None
        return Artifact(kind, aid, d, read_manifest(m, kind, aid))

    def exists(self, kind: str, aid: str) -> bool:
        d = self.root / kind / aid
        if any(is_link(p) for p in (self.root / kind, d, d / layout.MANIFEST)):
            return False
        return (d / layout.MANIFEST).is_file()

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
            refuse_link(d)
            if not d.is_dir():
                continue
            for sub in sorted(d.iterdir()):
                refuse_link(sub)
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
                raise UsageError(f"{raw!r} is {a(k)} reference, but {a(want_kind)} artifact is needed here")
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
    def links(self, *, deep: bool = False) -> list[Path]:
        """The symbolic links inside the store where a directory or file of the store's own should be: the
        index, `.tmp`, `.pending`, `names/` and its entries, the kind directories and the artifact directories
        (with `deep`, also the files inside artifacts). Nothing is followed."""
        out: list[Path] = []
        root = self.root
        if not root.is_dir():
            return out
        index_files = (layout.INDEX, layout.INDEX + ".wal")  # DuckDB writes them: never another file
        for rel in (*index_files, layout.TMP_DIR, layout.PENDING_DIR, layout.NAMES_DIR, *layout.KINDS):
            p = root / rel
            if is_link(p):
                out.append(p)
                continue
            if not p.is_dir() or rel in (layout.TMP_DIR, layout.PENDING_DIR, *index_files):
                continue
            with contextlib.suppress(OSError):
                for sub in sorted(p.iterdir()):
                    if is_link(sub):
                        out.append(sub)
                    elif rel == layout.NAMES_DIR and sub.is_dir():
                        out += [f for f in sorted(sub.iterdir()) if is_link(f)]
                    elif deep and sub.is_dir():
                        for top, dirs, files in os.walk(sub, followlinks=False):
                            for n in sorted(dirs + files):
                                if is_link(Path(top) / n):
                                    out.append(Path(top) / n)
        return out

    def check_links(self) -> None:
        """UsageError (exit 2) naming the first link `links()` finds."""
        found = self.links()
        if found:
            refuse_link(found[0])

    def check_root(self, *, must_exist: bool = False, links: bool = True) -> None:
        """UsageError (exit 2) when the store path is not a usable directory, or (`links`) holds a symbolic
        link where a directory or file of its own should be."""
        origin = f" (from {self.origin})" if self.origin else ""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(
                f"store {self.root}{origin} is not a directory",
                hint="point --store or $TRACE_STORE at a directory; it is created on first write",
            )
        if must_exist and not self.root.is_dir():
            raise UsageError(
                f"store {self.root}{origin} does not exist",
                hint="check --store / $TRACE_STORE, or create it by running a stage such as `trace ingest`",
            )
        if links:
            self.check_links()

    # ---------------------------------------------------------------- derived data
    def after_commit(self, art: Artifact) -> bool:
        """Called by the writer once `art` is committed; True when everything derived from the manifests is up
        to date (its pending marker is then dropped). The bare tree derives nothing."""
        return True


def _read_name(f: Path) -> str | None:
    """The id a `names/KIND/NAME` file holds, read without following a link; None for a subdirectory. A link
    or a file that does not hold an id is refused (exit 2) without showing its content."""
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if is_link(f):
            refuse_link(f)
        if e.errno == errno.EISDIR:
            return None
        raise UsageError(f"{shown(str(f))}: cannot read this name ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                return None
            raise UsageError(f"{shown(str(f))}: a name must be a regular file holding an artifact id")
        data = os.read(fd, 64)
    finally:
        os.close(fd)
    aid = data.decode("ascii", "replace").strip()
    if not _ID_RE.match(aid):
        raise UsageError(
            f"{shown(str(f))}: does not hold an artifact id",
            hint="remove the name, or set it again by rerunning the step with --name",
        )
    return aid


RESUMABLE = "RESUMABLE"  # marker file of a training work dir that `trace train --resume` can continue
