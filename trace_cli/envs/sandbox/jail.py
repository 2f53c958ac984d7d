"""The OS-level sandbox for untrusted environment modules: bubblewrap + a seccomp filter.

`bwrap` (Debian/Ubuntu package `bubblewrap`) starts the child in new user, pid, network, ipc, uts and cgroup
namespaces, as uid/gid 65534 (nobody), with:
  * a filesystem that holds only what the child needs, read-only: /usr and the loader's libraries, the
    Python installation, and the trace_cli package directory (nothing else of the repository or the store);
    a private writable working directory (the only writable place); a fresh /proc and a minimal /dev;
    no /etc, /home, /root or /tmp;
  * the shared libraries behind ctypes and subprocess replaced by /dev/null, so they cannot be imported;
  * `--die-with-parent` and a new session: the child dies with the CLI and cannot reach its terminal;
  * a seccomp filter (classic BPF, built here) that refuses fork, vfork, clone without CLONE_THREAD, clone3
    (ENOSYS, so libc falls back to clone) and ptrace: the module cannot start a process, so a process-count
    limit of one holds by construction, whatever the user namespace does to RLIMIT_NPROC.
Memory, file-size and CPU limits are rlimits set by the child (see `child.py`) before the module is loaded.

Where bwrap is missing or cannot create namespaces (some containers), `available()` is False and callers
refuse untrusted modules unless the user explicitly accepts running them with the in-process guards only.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path

import trace_cli

NOBODY = 65534

# --- seccomp (classic BPF over struct seccomp_data: nr @0, arch @4, ip @8, args[6] @16) -------------------
_LD_W_ABS, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
_ARCH = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "ptrace": 101, "clone3": 435}),
    "aarch64": (0xC00000B7, {"clone": 220, "ptrace": 117, "clone3": 435}),
}


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as bytes (what `bwrap --seccomp FD` reads): refuse new processes and ptrace, allow the rest."""
    machine = machine or os.uname().machine
    if machine not in _ARCH:
        raise OSError(f"no seccomp filter for architecture {machine}")
    arch, nr = _ARCH[machine]
    denied = [nr[n] for n in ("fork", "vfork", "ptrace") if n in nr]
    prog = [
        _ins(_LD_W_ABS, 0, 0, 4),
        _ins(_JEQ, 1, 0, arch),
        _ins(_RET, 0, 0, _RET_KILL),
        _ins(_LD_W_ABS, 0, 0, 0),
    ]
    # layout after the denied checks: [clone3?] [clone?] [ld arg0] [jset] [eperm] [enosys] [allow]
    # (a jump offset k from instruction i lands on i + 1 + k)
    n = len(denied)
    for i, number in enumerate(denied):  # jump to EPERM
        prog.append(_ins(_JEQ, (n - i - 1) + 4, 0, number))
    prog.append(_ins(_JEQ, 4, 0, nr["clone3"]))  # -> ENOSYS
    prog.append(_ins(_JEQ, 0, 4, nr["clone"]))  # not clone -> ALLOW
    prog.append(_ins(_LD_W_ABS, 0, 0, 16))  # clone flags (low 32 bits of args[0])
    prog.append(_ins(_JSET, 2, 0, _CLONE_THREAD))  # a thread -> ALLOW
    prog.append(_ins(_RET, 0, 0, _RET_ERRNO | _EPERM))
    prog.append(_ins(_RET, 0, 0, _RET_ERRNO | _ENOSYS))
    prog.append(_ins(_RET, 0, 0, _RET_ALLOW))
    return b"".join(prog)


# --- the filesystem view -----------------------------------------------------------------------------------
MASKED_MODULES = ("_ctypes", "_posixsubprocess", "_multiprocessing")


def interpreter() -> str:
    """The real interpreter binary (not a venv link: the venv is not mounted in the sandbox)."""
    return os.path.realpath(sys.executable)


def package_root() -> str:
    """The directory holding the trace_cli package (added to the child's sys.path)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(trace_cli.__file__)))


def _masked_files() -> list[str]:
    out = []
    for name in MASKED_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if origin and os.path.isfile(origin):  # built into the interpreter: the seccomp filter still holds
            out.append(os.path.realpath(origin))
    return sorted(out)


def _ro_dirs() -> list[str]:
    dirs = {"/usr"}
    for d in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.exists(d):
            dirs.add(d)
    for p in (sys.base_prefix, sys.base_exec_prefix):
        dirs.add(os.path.realpath(p))
    return sorted(dirs)


def command(workdir: str, seccomp_fd: int | None, extra_ro: tuple[str, ...] = ()) -> list[str]:
    """The bwrap argument list that runs the child (append the child's own argv); `extra_ro` are files
    shown read-only at their own paths."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise OSError("bwrap (bubblewrap) is not installed")
    cmd = [
        exe,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
    ]
    for d in _ro_dirs():
        if os.path.islink(d):  # usr-merged systems: /lib -> usr/lib
            cmd += ["--symlink", os.readlink(d), d]
        else:
            cmd += ["--ro-bind", d, d]
    pkg = os.path.join(package_root(), "trace_cli")
    cmd += ["--ro-bind", pkg, pkg]
    for f in _masked_files():
        cmd += ["--ro-bind", "/dev/null", f]
    for f in extra_ro:
        cmd += ["--ro-bind", f, f]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, workdir, "--chdir", workdir]
    cmd += ["--remount-ro", "/"]  # bwrap's own root (a tmpfs holding the mount points) becomes read-only too
    cmd += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return cmd


def seccomp_fd() -> int:
    """A pipe's read end holding the filter (inherit it with pass_fds; close it after Popen)."""
    prog = seccomp_program()
    r, w = os.pipe()
    try:
        os.write(w, prog)
    finally:
        os.close(w)
    return r


@cache
def available() -> bool:
    """True when bwrap runs the interpreter here with every namespace and the seccomp filter."""
    if shutil.which("bwrap") is None:
        return False
    tmp = Path(os.environ.get("TMPDIR") or "/tmp") / f"trace-jail-probe-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    fd = None
    try:
        fd = seccomp_fd()
        probe = "import os\ntry:\n    os.fork()\nexcept OSError:\n    print('ok')"
        r = subprocess.run(
            [*command(str(tmp), fd), interpreter(), "-I", "-S", "-c", probe],
            pass_fds=(fd,),
            capture_output=True,
            timeout=30,
        )
        return r.returncode == 0 and r.stdout.strip() == b"ok"
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if fd is not None:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
