"""The OS-level sandbox for untrusted environment modules: bubblewrap + a seccomp filter.

`bwrap` (Debian/Ubuntu package `bubblewrap`, 0.7 or newer for `--size`) starts the child in new user, pid,
network, ipc, uts and cgroup namespaces, as uid/gid 65534 (nobody), with:
  * a filesystem that holds only what the child needs, read-only: /usr and the loader's libraries, the
    Python installation, and the trace_cli package directory (nothing else of the repository or the store);
    the working directory is a private tmpfs of fixed size and inode count (`work_mb`, WORK_INODES; mounted
    noexec, so nothing written there loads as native code), the only writable place: a module that fills it
    gets ENOSPC and nothing on the host grows; a minimal /dev mounted read-only (so no /dev/shm, which would
    be a host-sized tmpfs outside every limit); no /proc at all (so no /proc/self/mem to rewrite the
    interpreter's own memory with); no /etc, /home, /root or /tmp;
  * every Python extension module on the jail's filesystem, whatever Python installation it belongs to and
    wherever it lies, replaced by /dev/null, but an allow-list of the interpreter's own (SAFE_EXTENSIONS), so
    ctypes, cffi, subprocess, multiprocessing, sub-interpreters and the like load under no name;
  * `--die-with-parent` and a new session: the child dies with the CLI and cannot reach its terminal;
    `--disable-userns` where bwrap has it;
  * a seccomp filter (classic BPF, built here) that refuses fork, vfork, clone without CLONE_THREAD, clone3
    (ENOSYS, so libc falls back to clone) and ptrace: the module cannot start a process, so a process-count
    limit of one holds by construction, whatever the user namespace does to RLIMIT_NPROC; and the kernel
    interfaces a module never needs and that widen the attack surface or escape the limits: unshare, setns
    and the mount calls (nested namespaces), io_uring, bpf, the key-ring calls, perf_event_open,
    userfaultfd, memfd_create and memfd_secret (memory outside RLIMIT_AS), pidfd_getfd, modify_ldt, AF_VSOCK
    sockets, module loading and kexec, process_vm_*; and on x86_64 every x32-ABI number (same audit arch,
    different numbers).
Memory, file-size and CPU limits are rlimits set by the child (see `child.py`) before the module is loaded.

Where bwrap is missing or cannot create namespaces (some containers), `available()` is False and callers
refuse untrusted modules unless the user explicitly accepts running them with the in-process guards only.
"""

from __future__ import annotations

import importlib.util
import os
import re
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
_AF_VSOCK = 40
# refused with EPERM (besides fork/vfork/clone-as-fork and AF_VSOCK sockets); clone3 gets ENOSYS (libc then
# uses clone); names an architecture does not have (modify_ldt off x86) are skipped
DENIED = (
    "fork", "vfork", "ptrace", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open", "userfaultfd", "memfd_create", "process_vm_readv", "process_vm_writev",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
    "pidfd_getfd", "memfd_secret", "modify_ldt",
)  # fmt: skip
# (x86_64, aarch64) numbers of the calls the filter names; None where the architecture has no such call
_NUMBERS = {
    "socket": (41, 198), "clone": (56, 220), "fork": (57, None), "vfork": (58, None), "ptrace": (101, 117),
    "modify_ldt": (154, None), "pivot_root": (155, 41), "chroot": (161, 51), "mount": (165, 40),
    "umount2": (166, 39), "init_module": (175, 105), "delete_module": (176, 106), "kexec_load": (246, 104),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "unshare": (272, 97),
    "perf_event_open": (298, 241), "open_by_handle_at": (304, 265), "setns": (308, 268),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "finit_module": (313, 273),
    "memfd_create": (319, 279), "kexec_file_load": (320, 294), "bpf": (321, 280), "userfaultfd": (323, 282),
    # the generic table from 425 on is the same everywhere
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "clone3": (435, 435), "pidfd_getfd": (438, 438),
    "mount_setattr": (442, 442), "memfd_secret": (447, 447),
}  # fmt: skip
# machine: (audit arch, {call: number})
_ARCH = {
    machine: (arch, {name: nrs[i] for name, nrs in _NUMBERS.items() if nrs[i] is not None})
    for i, (machine, arch) in enumerate((("x86_64", 0xC000003E), ("aarch64", 0xC00000B7)))
}


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(lines: list[tuple]) -> bytes:
    """Classic BPF from (label or None, opcode, k, jump-if-true label, jump-if-false label): a jump label of
    None means the next instruction; jumps only go forward, at most 255 instructions."""
    where = {label: i for i, (label, *_rest) in enumerate(lines) if label}
    out = []
    for i, (_label, op, k, jt, jf) in enumerate(lines):
        offsets = [0 if t is None else where[t] - i - 1 for t in (jt, jf)]
        if not all(0 <= o <= 255 for o in offsets):
            raise AssertionError("seccomp program too long for its jumps")
        out.append(_ins(op, offsets[0], offsets[1], k))
    return b"".join(out)


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as bytes (what `bwrap --seccomp FD` reads): refuse new processes, ptrace, AF_VSOCK sockets
    and the calls in DENIED, allow the rest."""
    machine = machine or os.uname().machine
    if machine not in _ARCH:
        raise OSError(f"no seccomp filter for architecture {machine}")
    arch, nr = _ARCH[machine]
    lines: list[tuple] = [(None, _LD_W_ABS, 4, None, None), (None, _JEQ, arch, None, "kill")]
    lines.append((None, _LD_W_ABS, 0, None, None))
    if machine == "x86_64":
        lines.append((None, _JGE, _X32_SYSCALL_BIT, "enosys", None))  # an x32 number: none is allowed
    lines += [(None, _JEQ, n, "eperm", None) for n in sorted({nr[n] for n in DENIED if n in nr})]
    lines += [(None, _JEQ, nr["clone3"], "enosys", None), (None, _JEQ, nr["socket"], "socket", None)]
    lines += [
        (None, _JEQ, nr["clone"], None, "allow"),
        (None, _LD_W_ABS, 16, None, None),  # clone flags (low 32 bits of args[0])
        (None, _JSET, _CLONE_THREAD, "allow", "eperm"),  # only a thread
        ("socket", _LD_W_ABS, 16, None, None),  # the address family
        (None, _JEQ, _AF_VSOCK, "eperm", "allow"),
        ("eperm", _RET, _RET_ERRNO | _EPERM, None, None),
        ("enosys", _RET, _RET_ERRNO | _ENOSYS, None, None),
        ("allow", _RET, _RET_ALLOW, None, None),
        ("kill", _RET, _RET_KILL, None, None),
    ]
    return _assemble(lines)


# --- the filesystem view -----------------------------------------------------------------------------------
# Python extension modules are native code the audit hook cannot follow, and any of them loads under any name
# (`ExtensionFileLoader(name, path)`), so every file on the jail's read-only view that is one (named with a
# CPython extension suffix of any version, or plain `.so` under a python*/ tree, or a libpython, which holds
# the built-in modules of its build) is replaced by /dev/null, except the interpreter's own libpython and
# these standard extensions of its own lib-dynload: plain computation, hashing, compression and parsing
SAFE_EXTENSIONS = frozenset(
    {
        "_bisect", "_blake2", "_bz2", "_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp",
        "_codecs_kr", "_codecs_tw", "_contextvars", "_csv", "_datetime", "_decimal", "_elementtree",
        "_hashlib", "_heapq", "_json", "_lzma", "_md5", "_multibytecodec", "_opcode", "_pickle", "_queue",
        "_random", "_sha1", "_sha256", "_sha3", "_sha512", "_statistics", "_struct", "_typing", "_uuid",
        "_zoneinfo", "array", "binascii", "cmath", "math", "pyexpat", "resource", "select", "unicodedata",
        "zlib", "_socket",
    }
)  # fmt: skip
_EXTENSION_NAME = re.compile(r"\.(cpython-[^./]*|abi3|pypy[^./]*)\.so$|^libpython[^/]*\.so")
WORK_TMPFS_MODE = "0700"
WORK_INODES = 4096  # files and directories in the work tmpfs, all together (each costs kernel memory)


def interpreter() -> str:
    """The real interpreter binary (not a venv link: the venv is not mounted in the sandbox)."""
    return os.path.realpath(sys.executable)


def package_root() -> str:
    """The directory holding the trace_cli package (added to the child's sys.path)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(trace_cli.__file__)))


def masked_extensions(
    paths: tuple[str, ...], native: tuple[str, ...] | frozenset[str] = ()
) -> tuple[str, ...]:
    """Every extension module under `paths` (a world's mounted packages) but those of the packages named in
    `native` (envs.worlds.preload.NATIVE): mounted over with /dev/null in the jail."""
    out = []
    for p in paths:
        if not os.path.isdir(p) or os.path.basename(p) in set(native):
            continue
        out += [os.path.realpath(f) for f in _extensions_under(p)]
    return tuple(sorted(out))


def _extensions_under(root: str) -> list[str]:
    """Every regular file under `root` (symlinks not followed) that is a Python extension module by name."""
    out, todo = [], [root]
    while todo:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False) and (
                    _EXTENSION_NAME.search(e.name) or (e.name.endswith(".so") and "/python" in d)
                ):
                    out.append(e.path)
            except OSError:
                continue
    return out


def _own_libpython() -> set[str]:
    try:
        maps = Path("/proc/self/maps").read_text().split("\n")
    except OSError:
        return set()
    return {os.path.realpath(m.split()[-1]) for m in maps if "/libpython" in m}


@cache
def _masked_files() -> tuple[str, ...]:
    """Every extension module on the jail's read-only view but the allowed ones of this interpreter (see
    SAFE_EXTENSIONS); a walk of the whole view, about a second, once per process."""
    dynload = os.path.dirname(importlib.util.find_spec("_json").origin or "")
    keep = _own_libpython()
    found: set[str] = set()
    roots = {os.path.realpath(d) for d in _ro_dirs()}
    for root in [r for r in roots if not any(r != o and _under(r, o) for o in roots)]:
        found.update(os.path.realpath(f) for f in _extensions_under(root))
    for f in found:
        if os.path.dirname(f) == dynload and os.path.basename(f).split(".")[0] in SAFE_EXTENSIONS:
            keep.add(f)
    return tuple(sorted(found - keep))


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
    extra_masked: tuple[str, ...] = (),
) -> list[str]:
    """The argument list that runs the child (append the child's own argv); `extra_ro` are files and
    directories shown read-only at their own paths, `extra_masked` files under them shown as /dev/null (a
    world's package directories and the extension modules in them it may not load: `envs.worlds.preload`). `workdir` is a fresh tmpfs of `work_bytes` and WORK_INODES inodes inside
    the jail (the host directory of that name stays empty): mounted by `mount` in a user and mount namespace
    of its own that bwrap then starts in, since bwrap's --tmpfs bounds bytes only; where that cannot be done
    here, bwrap's --tmpfs of `work_bytes` (no inode bound, not noexec)."""
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
    for f in extra_masked:
        cmd += ["--ro-bind", "/dev/null", f]
    cmd += ["--dev", "/dev", "--remount-ro", "/dev"]  # no /dev/shm (read-only), devices still work
    prefix = _work_mount(workdir, work_bytes)
    if prefix:
        cmd += ["--bind", workdir, workdir, "--chdir", workdir]
    else:
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
    return [*prefix, *cmd]


_MOUNT_THEN_EXEC = 'mount -t tmpfs -o "$1" trace-work "$2" && shift 2 && exec "$@"'


def _work_mount(workdir: str, work_bytes: int) -> list[str]:
    """The prefix that mounts the work tmpfs with an inode bound before bwrap starts, or [] where unshare,
    mount or user namespaces are missing here."""
    if not _can_mount_tmpfs():
        return []
    options = f"size={int(work_bytes)},nr_inodes={WORK_INODES},mode={WORK_TMPFS_MODE},noexec,nosuid,nodev"
    return _mount_prefix(workdir, options)


def _mount_prefix(workdir: str, options: str) -> list[str]:
    unshare = shutil.which("unshare") or "unshare"
    return [
        unshare,
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        _MOUNT_THEN_EXEC,
        "sh",
        options,
        workdir,
    ]


@cache
def _can_mount_tmpfs() -> bool:
    if not (shutil.which("unshare") and shutil.which("mount") and shutil.which("sh")):
        return False
    with tempfile.TemporaryDirectory(prefix="trace-jail-mount-") as d:
        try:
            r = subprocess.run(
                [*_mount_prefix(d, "size=1048576,nr_inodes=8"), "true"], capture_output=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return r.returncode == 0


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
