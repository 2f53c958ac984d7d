"""Malicious environment modules against the OS sandbox (bubblewrap + seccomp) and the audit hook.

Each module tries to escape in one way: walk frames to switch the guard off, search the garbage collector
for it, patch the guard's globals and builtins, load ctypes, fork, read or write files outside its
directory, reach a server on the host's loopback, or leave a process behind. Every one must be rejected
and leave no trace: no file written, no connection made, no process alive afterwards. The OS layer is also
tested on its own, with no audit hook at all, since that is the security boundary."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from trace_testing import processes_mentioning, snapshot

from trace_cli.envs.sandbox import Limits, SandboxViolation, SandboxWorker, check_module, jail
from trace_cli.envs.sandbox import worker as worker_mod
from trace_cli.errors import UsageError

FAST = Limits(cpu_s=2.0, timeout_s=20.0, memory_mb=512)
TEMPLATE_TAIL = (
    "\n    from trace_cli.envs.synthetic import TEMPLATES\n"
    "    return TEMPLATES['precondition_verification'](**params)\n"
)

pytestmark = pytest.mark.needs_sandbox


def _module(body: str) -> str:
    """make_env runs `body` (which may swallow errors) and then returns a perfectly good environment."""
    return (
        "import os, sys\n\ndef make_env(**params):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + TEMPLATE_TAIL
    )


ESCAPES = {
    # walk up to the child's main() frame and clear what it holds; then write outside
    "frame walking": """
        f = sys._getframe()
        while f is not None:
            for k, v in list(f.f_locals.items()):
                if isinstance(v, (set, list, dict)):
                    try:
                        v.clear()
                    except Exception:
                        pass
            f = f.f_back
        try:
            open('{evil}', 'w').write('x')
        except Exception:
            pass
    """,
    # find the hook's closure through the garbage collector and replace its cells
    "gc object search": """
        import gc
        for o in gc.get_objects():
            if callable(o) and getattr(o, '__name__', '') == 'hook':
                for c in o.__closure__ or ():
                    c.cell_contents = lambda *a: None
        open('{evil}', 'w').write('x')
    """,
    # rebind the child's module globals and builtins the guard might look up
    "patched globals and builtins": """
        import builtins
        main = sys.modules['__main__']
        for name in ('_NET', '_PROC', '_PATH_EVENTS', '_PROC_EVENTS', '_INTROSPECTION'):
            setattr(main, name, frozenset())
        builtins.any = lambda *a, **k: True
        builtins.type = lambda *a: str
        os.path.realpath = lambda p, *a, **k: '/'
        try:
            open('{evil}', 'w').write('x')
        except Exception:
            pass
    """,
    "ctypes": """
        import ctypes
        ctypes.CDLL(None).fork()
    """,
    "ctypes extension loaded by path": """
        import importlib.machinery, glob
        for p in glob.glob(sys.base_prefix + '/lib/python3*/lib-dynload/_ctypes*.so'):
            importlib.machinery.ExtensionFileLoader('_ctypes', p).load_module()
    """,
    "fork bomb": """
        for _ in range(64):
            try:
                os.fork()
            except OSError:
                pass
    """,
    "subprocess": """
        import subprocess
        subprocess.Popen(['/bin/sh', '-c', 'sleep 300'], start_new_session=True)
    """,
    "read /etc/shadow": """
        print(open('/etc/shadow').read())
    """,
    "read the store": """
        print(open('{manifest}').read())
    """,
    "write into the store": """
        open('{manifest}', 'a').write('tampered')
    """,
    "network to the host": """
        import socket
        s = socket.create_connection(('127.0.0.1', {port}), timeout=2)
        s.sendall(b'escaped')
    """,
    "chdir then relative write": """
        os.chdir('/')
        open('tmp/evil', 'w').write('x')
    """,
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_malicious_module_is_rejected_and_leaves_no_trace(store_root, tmp_path, case):
    manifest = next(store_root.glob("diagnosis/*/manifest.yaml"))
    evil = tmp_path / "evil.txt"
    hits: list[bytes] = []
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            hits.append(conn.recv(64))
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    before = snapshot(store_root)
    src = _module(ESCAPES[case].format(evil=evil, manifest=manifest, port=srv.getsockname()[1]))
    try:
        v = check_module(
            src, {}, FAST, reference_seeds=20, determinism_seeds=2, do_nothing_seeds=5, leakage_seeds=5
        )
    finally:
        stop.set()
        t.join()
        srv.close()
    assert not v.accepted, f"{case}: accepted"
    assert v.reason, case
    assert snapshot(store_root) == before
    assert not evil.exists() and not hits
    assert not Path("/tmp/evil").exists()


def test_the_os_layer_holds_without_any_audit_hook(tmp_path, run_in_jail):
    """Run plain Python (no child program, no hook) in the jail: the namespaces, the read-only view, the
    seccomp filter and the masked extension modules alone stop every escape."""
    outside = tmp_path / "outside.txt"
    probe = textwrap.dedent(f"""
        import os, socket
        out['uid'] = os.getuid()
        attempt('read_shadow', lambda: open('/etc/shadow').read())
        attempt('read_passwd', lambda: open('/etc/passwd').read())
        attempt('list_root_home', lambda: os.listdir('/root/.ssh'))
        attempt('write_outside', lambda: open({str(outside)!r}, 'w').write('x'))
        attempt('write_usr', lambda: open('/usr/evil', 'w').write('x'))
        attempt('fork', os.fork)
        attempt('posix_spawn', lambda: os.posix_spawn('/bin/true', ['true'], {{}}))
        attempt('ctypes', lambda: __import__('ctypes'))
        attempt('subprocess', lambda: __import__('subprocess').run(['/bin/true']))
        attempt('network', lambda: socket.create_connection(('1.1.1.1', 80), timeout=2))
        attempt('write_dev_shm', lambda: open('/dev/shm/evil', 'w').write('x'))
        attempt('write_proc_self_mem', lambda: open('/proc/self/mem', 'r+b'))
        attempt('write_workdir', lambda: open('ok.txt', 'w').write('x'))
        print(repr(out))
    """)
    out = run_in_jail(probe)
    assert out.pop("uid") == jail.NOBODY
    assert out.pop("write_workdir") == "ALLOWED"
    assert {k: v for k, v in out.items() if v == "ALLOWED"} == {}, out
    assert not outside.exists() and not Path("/usr/evil").exists()


def test_the_sandbox_dies_with_the_cli(tmp_path):
    """SIGKILL the process that owns a worker: nothing of the sandbox survives it."""
    marker = tmp_path / "pid"
    prog = textwrap.dedent(f"""
        import sys, time
        from trace_cli.envs.sandbox import Limits, SandboxWorker
        src = "import time\\ndef make_env(**p):\\n    time.sleep(600)\\n"
        w = SandboxWorker(src, Limits(cpu_s=600, timeout_s=600, memory_mb=1024))
        open({str(marker)!r}, 'w').write(str(w.workdir))
        w.call('new', params={{}})
    """)
    # its sandbox directory stays behind (SIGKILL cannot be caught): made under tmp_path, not the real /tmp
    cli = subprocess.Popen([sys.executable, "-c", prog], env=dict(os.environ, TMPDIR=str(tmp_path)))
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    workdir = marker.read_text()
    assert processes_mentioning(workdir), "the sandbox never started"
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 10
    while processes_mentioning(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_mentioning(workdir)


def test_a_dead_sandbox_cannot_be_reused_and_says_why():
    with SandboxWorker(_module("os.fork()"), FAST) as w:
        with pytest.raises(SandboxViolation, match="not allowed"):
            w.call("new", params={})
        with pytest.raises(SandboxViolation, match="not allowed"):
            w.call("ping")


def test_without_an_os_sandbox_modules_need_explicit_consent(monkeypatch):
    monkeypatch.setattr(jail, "available", lambda: False)
    monkeypatch.delenv(worker_mod.UNSAFE_ENV, raising=False)
    good = _module("pass")
    with pytest.raises(UsageError, match="bubblewrap"):
        SandboxWorker(good, FAST)
    with pytest.warns(UserWarning, match="WITHOUT an OS sandbox"):
        with SandboxWorker(good, FAST, unsafe_local_exec=True) as w:
            assert w.isolation in ("unshare", "audit-hook")
            assert w.call("new", params={})["handle"] == 1


def _run_bpf(prog: bytes, nr: int, arch: int = 0xC000003E, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the instructions the filter uses, over a seccomp_data record."""
    import struct

    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:
            acc = struct.unpack("=I", data[k : k + 4])[0]
            pc += 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x45:
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def test_the_seccomp_filter_decides_each_syscall_as_documented():
    prog = jail.seccomp_program("x86_64")
    eperm, enosys, allow, kill = 0x00050001, 0x00050026, 0x7FFF0000, 0x80000000
    assert _run_bpf(prog, 57) == eperm  # fork
    assert _run_bpf(prog, 58) == eperm  # vfork
    assert _run_bpf(prog, 101) == eperm  # ptrace
    assert _run_bpf(prog, 435) == enosys  # clone3: libc falls back to clone
    assert _run_bpf(prog, 56, arg0=0x11) == eperm  # clone as fork (SIGCHLD)
    assert _run_bpf(prog, 56, arg0=0x3D0F00) == allow  # clone for a thread (CLONE_THREAD | ...)
    assert _run_bpf(prog, 0) == allow and _run_bpf(prog, 59) == allow  # read; execve of itself only
    assert _run_bpf(prog, 57, arch=0x40000003) == kill  # another ABI (i386) is killed
    # issue 25: nested namespaces, io_uring, bpf, key rings, perf, userfaultfd, memfd, mounts: EPERM
    for name in jail.DENIED:
        if name in jail._ARCH["x86_64"][1]:
            assert _run_bpf(prog, jail._ARCH["x86_64"][1][name]) == eperm, name
    for nr in (272, 308, 425, 426, 427, 321, 250, 248, 249, 298, 323, 319, 165):
        assert _run_bpf(prog, nr) == eperm, nr
    assert _run_bpf(prog, 0x40000000 | 39) == enosys  # an x32-ABI number (x86_64's audit arch): none passes
    assert _run_bpf(prog, 0x40000000 | 272) == enosys
    for nr in (0, 1, 2, 3, 9, 10, 11, 12, 39, 60, 202, 231, 318, 334, 424, 436):  # ordinary calls still pass
        assert _run_bpf(prog, nr) == allow, nr
    arm = jail.seccomp_program("aarch64")
    arm_arch = 0xC00000B7
    assert _run_bpf(arm, 97, arch=arm_arch) == eperm  # unshare
    assert _run_bpf(arm, 425, arch=arm_arch) == eperm  # io_uring_setup
    assert _run_bpf(arm, 435, arch=arm_arch) == enosys  # clone3
    assert _run_bpf(arm, 220, arch=arm_arch, arg0=0x11) == eperm  # clone as fork
    assert _run_bpf(arm, 220, arch=arm_arch, arg0=0x3D0F00) == allow  # a thread
    assert _run_bpf(arm, 63, arch=arm_arch) == allow  # read
    assert _run_bpf(arm, 0x40000000 | 63, arch=arm_arch) == allow  # no x32 rule on aarch64
