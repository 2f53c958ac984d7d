"""Low-level commit steps: durable manifest writes, an atomic directory swap for `--force`, the pending-index
journal, and process-liveness helpers shared by commit and gc.

Commit protocol (see ArtifactWriter.commit): the manifest is written and fsynced *inside* the temp directory,
then one rename makes the directory, manifest included, visible. So a directory under STORE/KIND/ without a
manifest is never a live commit. Before the rename a marker is put in STORE/.pending/; it is removed once
the index has the artifact, so a run killed in between leaves a marker that the next command uses to repair
the index (index.sync).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import yaml

from trace_cli.store import layout

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write `path` atomically and durably (temp file, fsync, rename)."""
    from trace_cli.config import safe_yaml  # noqa: F401  (safe_dump then quotes ids such as '748028e155117613')

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, final: Path) -> None:
    """Replace the committed directory `final` by `new` so that a concurrent reader never finds a file
    missing: an atomic swap where the kernel has one, else file by file (each file replaced atomically, files
    the new version lacks removed afterwards, the manifest last). `new` is removed afterwards."""
    if _renameat2_exchange(new, final):
        fsync_dir(final.parent)
        shutil.rmtree(new, ignore_errors=True)  # now holds the old version
        return
    new_files = [p for p in sorted(new.rglob("*")) if p.is_file() and p.name != layout.MANIFEST]
    keep = {p.relative_to(new).as_posix() for p in new_files} | {layout.MANIFEST}
    for p in new_files:
        dst = final / p.relative_to(new)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, dst)
    os.replace(new / layout.MANIFEST, final / layout.MANIFEST)
    for p in sorted(final.rglob("*"), reverse=True):
        rel = p.relative_to(final).as_posix()
        if p.is_file() and rel not in keep:
            p.unlink(missing_ok=True)
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    shutil.rmtree(new, ignore_errors=True)


# ------------------------------------------------------------------------------------ pending-index journal
def mark_pending(root: Path, kind: str, aid: str) -> Path:
    d = root / layout.PENDING_DIR
    d.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(os.lstat(d).st_mode):
        from trace_cli.errors import UsageError

        raise UsageError(f"{d} is a symbolic link; the store does not follow it")
    p = d / f"{kind}-{aid}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    p.touch()
    return p


def pending(root: Path) -> list[Path]:
    """The markers in STORE/.pending; none when it is a symbolic link (never followed: its target's files
    would be taken for markers and removed; `Artifacts.check_root` refuses such a store)."""
    d = root / layout.PENDING_DIR
    try:
        if stat.S_ISLNK(os.lstat(d).st_mode):
            return []
        return sorted(d.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def clear_pending(marks: list[Path]) -> None:
    """Drop the markers of writers that are gone (a live writer removes its own once it has indexed)."""
    for m in marks:
        pid = pid_of(m.name)
        if pid is None or pid == os.getpid() or not alive(pid):
            m.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ processes and locks
def locked(path: Path) -> bool:
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


def pid_of(name: str) -> int | None:
    """The writer pid in a name `...-PID-HEX` (temp dirs, pending markers)."""
    parts = name.split("-")
    if len(parts) >= 4 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def alive(pid: int) -> bool:
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
