"""Sandbox directories left behind by a CLI that was killed (SIGKILL cannot be caught), and their removal.

Each `SandboxWorker` makes a directory `TMP/trace-sandbox-*` (the module file, its stderr log, the mount
point of its work tmpfs) and writes `owner` into it first thing: the pid and start time of the process that
made it. The directory is stale once that process is gone (or the pid now belongs to another process, told
apart by its start time); one without an `owner` file (killed between the two steps) is stale after a grace
period. `trace store gc` removes the stale ones (`--dry-run` lists them). The live workers are closed at exit
and on SIGTERM (`install_sigterm_cleanup`). Stdlib only: gc imports this without the sandbox worker.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
import weakref
from pathlib import Path

SANDBOX_PREFIX = "trace-sandbox-"
PROBE_PREFIX = "trace-jail-probe-"  # jail.available()'s probe directory, named by its pid
OWNER = "owner"
GRACE_S = 300.0


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); "" when unknown."""
    try:
        stat_ = Path(f"/proc/{pid}/stat").read_text()
        return stat_[stat_.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    """Whether the process runs; a zombie (killed, not yet reaped by its parent) does not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:
        stat_ = Path(f"/proc/{pid}/stat").read_text()
        return stat_[stat_.rindex(")") + 2 :].split()[0] != "Z"
    except (OSError, ValueError, IndexError):
        return True


def write_owner(directory: Path) -> None:
    """Record this process as the owner of a sandbox directory."""
    pid = os.getpid()
    (directory / OWNER).write_text(f"{pid} {_start_time(pid)}\n", encoding="utf-8")


def owner_alive(directory: Path) -> bool | None:
    """True/False from the `owner` file; None when there is none (or it cannot be read)."""
    try:
        parts = (directory / OWNER).read_text(encoding="utf-8").split()
        pid = int(parts[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid():
        return True
    if not _alive(pid):
        return False
    started = parts[1] if len(parts) > 1 else ""
    now = _start_time(pid)
    return not (started and now and started != now)  # the pid was reused by a later process


def stale_dirs(tmp: str | Path | None = None, *, grace_s: float = GRACE_S) -> list[Path]:
    """The sandbox (and jail probe) directories under `tmp` (default: the temp directory) whose owner is
    gone; only this user's, never a symbolic link."""
    root = Path(tmp or tempfile.gettempdir())
    out: list[Path] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    now = time.time()
    uid = os.getuid()
    for d in entries:
        name = d.name
        if not name.startswith((SANDBOX_PREFIX, PROBE_PREFIX)):
            continue
        try:
            st = d.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        if name.startswith(PROBE_PREFIX):
            tail = name[len(PROBE_PREFIX) :]
            if tail.isdigit() and int(tail) != os.getpid() and not _alive(int(tail)):
                out.append(d)
            continue
        alive = owner_alive(d)
        if alive is False or (alive is None and now - st.st_mtime > grace_s):
            out.append(d)
    return out


def remove_stale(tmp: str | Path | None = None, *, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Remove the stale directories; returns (removed or, with `dry_run`, found; those that failed)."""
    done: list[str] = []
    failed: list[str] = []
    for d in stale_dirs(tmp):
        if not dry_run:
            shutil.rmtree(d, ignore_errors=True)
            if d.exists():
                failed.append(str(d))
                continue
        done.append(str(d))
    return done, failed


# every live sandbox worker (anything with close()), closed at exit and on SIGTERM
LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close every live sandbox worker: its processes killed, its directory removed."""
    for w in list(LIVE):
        w.close()


_close_all = close_all


_SIGTERM_INSTALLED = False


def _on_sigterm(signum, frame) -> None:
    """Remove every sandbox (processes and directories), then die of SIGTERM as before: the default action
    skips atexit and finalizers, which left /tmp/trace-sandbox-* behind."""
    try:
        _close_all()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm_cleanup() -> None:
    """Install `_on_sigterm` once, from the main thread, where SIGTERM still has its default action (a
    caller's own handler is left alone: it decides how the process ends, and atexit then cleans up)."""
    global _SIGTERM_INSTALLED
    if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _SIGTERM_INSTALLED = True
