"""The OS-level sandbox for untrusted environment modules: bubblewrap + a seccomp filter.

`bwrap` (Debian/Ubuntu package `bubblewrap`, 0.7 or newer for `--size`) starts the child in new user, pid,
network, ipc, uts and cgroup namespaces, as uid/gid 65534 (nobody), with:
  * a filesystem that holds only what the child needs, read-only: /usr and the loader's libraries, the
    Python installation, and the trace_cli package directory (nothing else of the repository or the store);
    the working directory is a private tmpfs of fixed size (`work_mb`, the only writable place: a module
    that fills it gets ENOSPC and nothing on the host grows); a minimal /dev mounted read-only (so no
    /dev/shm, which would be a host-sized tmpfs outside every limit); no /proc at all (so no
    /proc/self/mem to rewrite the interpreter's own memory with); no /etc, /home, /root or /tmp;
  * every copy of the extension modules behind ctypes, cffi, subprocess and multiprocessing that lies on
    the jail's filesystem (the interpreter's own, the system Python's lib-dynload and dist-packages, ...)
    replaced by /dev/null, so none can be loaded under any name;
  * `--die-with-parent` and a new session: the child dies with the CLI and cannot reach its terminal;
    `--disable-userns` where bwrap has it;
  * a seccomp filter (classic BPF, built here) that refuses fork, vfork, clone without CLONE_THREAD, clone3
    (ENOSYS, so libc falls back to clone) and ptrace: the module cannot start a process, so a process-count
    limit of one holds by construction, whatever the user namespace does to RLIMIT_NPROC; and the kernel
    interfaces a module never needs and that widen the attack surface or escape the limits: unshare, setns
    and the mount calls (nested namespaces), io_uring, bpf, the key-ring calls, perf_event_open,
    userfaultfd, memfd_create (memory outside RLIMIT_AS), module loading and kexec, process_vm_*; and on
    x86_64 every x32-ABI number (same audit arch, different numbers).
Memory, file-size and CPU limits are rlimits set by the child (see `child.py`) before the module is loaded.

Where bwrap is missing or cannot create namespaces (some containers), `available()` is False and callers
refuse untrusted modules unless the user explicitly accepts running them with the in-process guards only.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import trace_cli

NOBODY = 65534

# --- seccomp (classic BPF over struct seccomp_data: nr @0, arch @4, ip @8, args[6] @16) -------------------
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000
# refused with EPERM (besides fork/vfork/clone-as-fork); clone3 gets ENOSYS (libc then uses clone)
DENIED = (
    "fork", "vfork", "ptrace", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open", "userfaultfd", "memfd_create", "process_vm_readv", "process_vm_writev",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
)  # fmt: skip
_ARCH = {
    "x86_64": (
        0xC000003E,
        {
            "clone": 56, "fork": 57, "vfork": 58, "ptrace": 101, "chroot": 161, "pivot_root": 155,
            "mount": 165, "umount2": 166, "init_module": 175, "delete_module": 176, "kexec_load": 246,
            "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
            "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
            "finit_module": 313, "memfd_create": 319, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
            "mount_setattr": 442,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "unshare": 97, "init_module": 105,
            "delete_module": 106, "kexec_load": 104, "ptrace": 117, "add_key": 217, "request_key": 218,
            "keyctl": 219, "clone": 220, "perf_event_open": 241, "open_by_handle_at": 265, "setns": 268,
            "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273, "memfd_create": 279,
            "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
        },
    ),
}  # fmt: skip


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as bytes (what `bwrap --seccomp FD` reads): refuse new processes, ptrace and the calls in
    DENIED, allow the rest."""
    machine = machine or os.uname().machine
    if machine not in _ARCH:
        raise OSError(f"no seccomp filter for architecture {machine}")
    arch, nr = _ARCH[machine]
    denied = sorted({nr[n] for n in DENIED if n in nr})
    prog = [
        _ins(_LD_W_ABS, 0, 0, 4),
        _ins(_JEQ, 1, 0, arch),
        _ins(_RET, 0, 0, _RET_KILL),
        _ins(_LD_W_ABS, 0, 0, 0),
    ]
    # tail (in this order): [ld arg0] [jset thread] [EPERM] [ENOSYS] [ALLOW]; a jump offset k from
    # instruction i lands on i + 1 + k, so from the instruction j places before the tail's EPERM (j = 1 is
    # the one right before it) EPERM is k = j - 1 away, ENOSYS k = j and ALLOW k = j + 1
    checks: list[tuple[int, int, str]] = []  # (opcode, k, target) in program order
    if machine == "x86_64":
        checks.append((_JGE, _X32_SYSCALL_BIT, "enosys"))  # an x32 number: none is allowed
    checks += [(_JEQ, n, "eperm") for n in denied]
    checks.append((_JEQ, nr["clone3"], "enosys"))
    n_checks = len(checks)
    for i, (op, k, target) in enumerate(checks):
        # instructions from this check to the tail's EPERM: the remaining checks, the clone check, the
        # ld and the jset (so EPERM is `left` instructions after the next one)
        left = (n_checks - i - 1) + 1 + 2
        jump = {"eperm": left, "enosys": left + 1}[target]
        prog.append(_ins(op, jump, 0, k))
    prog.append(_ins(_JEQ, 0, 4, nr["clone"]))  # not clone -> ALLOW
    prog.append(_ins(_LD_W_ABS, 0, 0, 16))  # clone flags (low 32 bits of args[0])
    prog.append(_ins(_JSET, 2, 0, _CLONE_THREAD))  # a thread -> ALLOW
    prog.append(_ins(_RET, 0, 0, _RET_ERRNO | _EPERM))
    prog.append(_ins(_RET, 0, 0, _RET_ERRNO | _ENOSYS))
    prog.append(_ins(_RET, 0, 0, _RET_ALLOW))
    if len(prog) > 250:  # 8-bit jump offsets
        raise AssertionError("seccomp program too long for its jumps")
    return b"".join(prog)


# --- the filesystem view -----------------------------------------------------------------------------------
# extension modules that would give the module native calls or new processes: masked wherever they lie
MASKED_MODULES = ("_ctypes", "_posixsubprocess", "_multiprocessing", "_cffi_backend")
# where Python extension modules live under a read-only root (a Python installation's lib-dynload and
# site-/dist-packages, Debian's shared dist-packages, /usr/local's)
_EXTENSION_DIRS = (
    "lib*/python*/lib-dynload",
    "lib*/python*/site-packages",
    "lib*/python*/dist-packages",
    "local/lib*/python*/lib-dynload",
    "local/lib*/python*/site-packages",
    "local/lib*/python*/dist-packages",
)
WORK_TMPFS_MODE = "0700"


def interpreter() -> str:
    """The real interpreter binary (not a venv link: the venv is not mounted in the sandbox)."""
    return os.path.realpath(sys.executable)


def package_root() -> str:
    """The directory holding the trace_cli package (added to the child's sys.path)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(trace_cli.__file__)))


def _is_masked_name(filename: str) -> bool:
    stem = filename.split(".", 1)[0]
    return stem in MASKED_MODULES and filename != stem and not filename.endswith((".py", ".pyi", ".pyc"))


@cache
def _masked_files() -> tuple[str, ...]:
    """Every file on the jail's read-only view that is one of MASKED_MODULES as an extension module: the
    interpreter's own, and any other Python installation's (the system Python's lib-dynload holds a
    `_ctypes` of the same ABI that `ExtensionFileLoader` would load under any name)."""
    out = set()
    for name in MASKED_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if origin and os.path.isfile(origin):  # built into the interpreter: the seccomp filter still holds
            out.add(os.path.realpath(origin))
    dirs: set[str] = set()
    for root in _ro_dirs():
        real = os.path.realpath(root)
        for pattern in _EXTENSION_DIRS:
            dirs.update(glob.glob(os.path.join(real, pattern)))
    for p in sys.path:  # the interpreter's own path entries inside the read-only view
        if p and os.path.isdir(p) and any(_under(os.path.realpath(p), r) for r in _ro_dirs()):
            dirs.add(os.path.realpath(p))
    for d in sorted(dirs):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            f = os.path.join(d, n)
            if _is_masked_name(n) and os.path.isfile(f):
                out.add(os.path.realpath(f))
    return tuple(sorted(out))


def _under(path: str, root: str) -> bool:
    root = os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _ro_dirs() -> list[str]:
    dirs = {"/usr"}
    for d in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.exists(d):
            dirs.add(d)
    for p in (sys.base_prefix, sys.base_exec_prefix):
        dirs.add(os.path.realpath(p))
    return sorted(dirs)


@cache
def _bwrap_help() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        return ""
    try:
        r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout + r.stderr


def command(
    workdir: str,
    seccomp_fd: int | None,
    extra_ro: tuple[str, ...] = (),
    *,
    work_bytes: int = 64 << 20,
) -> list[str]:
    """The bwrap argument list that runs the child (append the child's own argv); `extra_ro` are files
    shown read-only at their own paths. `workdir` is a fresh tmpfs of `work_bytes` inside the jail (the
    host directory of that name stays empty)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise OSError("bwrap (bubblewrap) is not installed")
    help_text = _bwrap_help()
    if "--size" not in help_text:
        raise OSError(
            "bwrap is too old: it has no --size (a size-limited tmpfs needs bubblewrap 0.7 or newer)"
        )
    cmd = [exe, "--unshare-all", "--unshare-user"]
    if "--disable-userns" in help_text:
        cmd.append("--disable-userns")
    cmd += ["--die-with-parent", "--new-session", "--uid", str(NOBODY), "--gid", str(NOBODY)]
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
    cmd += ["--dev", "/dev", "--remount-ro", "/dev"]  # no /dev/shm (read-only), devices still work
    cmd += [
        "--perms",
        WORK_TMPFS_MODE,
        "--size",
        str(int(work_bytes)),
        "--tmpfs",
        workdir,
        "--chdir",
        workdir,
    ]
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
    tmp = Path(tempfile.gettempdir()) / f"trace-jail-probe-{os.getpid()}"
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
