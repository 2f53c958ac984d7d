"""Sandbox hardening (issue 25): bounded resources, no leftovers, no raw syscalls.

A module that fills its work directory stops at a fixed quota and nothing on the host grows; a CLI killed
with SIGTERM removes its sandbox directory, one killed with SIGKILL leaves one that `trace store gc`
removes; inside the jail every raw syscall of the refused list fails even for code that has ctypes and no
audit hook; no copy of ctypes' extension is loadable; /dev/shm and /proc/self/mem are not writable; the
protocol accepts only the answer to the current call and no thread may run between calls; crafted
bytecode is refused, and a crash of the interpreter is reported as one."""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from trace_testing import processes_mentioning, run_trace

from trace_cli.envs.sandbox import (
    Limits,
    SandboxError,
    SandboxViolation,
    SandboxWorker,
    check_module,
    jail,
    leftovers,
    module_env_factory,
)

pytestmark = pytest.mark.needs_sandbox

FAST = Limits(cpu_s=2.0, timeout_s=20.0, memory_mb=512)
TEMPLATE_TAIL = (
    "\n    from trace_cli.envs.synthetic import TEMPLATES\n"
    "    return TEMPLATES['precondition_verification'](**params)\n"
)


def _module(body: str, tail: str = TEMPLATE_TAIL) -> str:
    return (
        "import os, sys\n\ndef make_env(**params):\n" + textwrap.indent(textwrap.dedent(body), "    ") + tail
    )


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


# ----------------------------------------------------------------------------------------------- item 1
FILL = """
    n = 0
    try:
        for i in range(40):  # 40 x 15 MB = 600 MB, each file under the 16 MB file limit
            with open(f'fill-{i}.bin', 'wb') as f:
                for _ in range(15):
                    f.write(b'x' * (1 << 20))
                    n += 1 << 20
    except OSError as e:
        {handler}
"""


def test_filling_the_work_directory_stops_at_the_quota_and_nothing_outside_grows():
    limits = Limits(cpu_s=20.0, timeout_s=60.0, memory_mb=512, work_mb=32)
    src = _module(FILL.replace("{handler}", "raise"))
    with SandboxWorker(src, limits) as w:
        with pytest.raises(SandboxViolation, match=r"work directory quota exceeded \(32 MB in all\)") as e:
            w.call("new", params={})
        assert e.value.exit_code == 1
        assert list(w.workdir.iterdir()) == [] and _du(w.dir) < 1 << 20
    v = check_module(
        src, {}, limits, reference_seeds=5, determinism_seeds=1, do_nothing_seeds=1, leakage_seeds=1
    )
    assert not v.accepted and "work directory quota exceeded" in v.reason
    # a module that swallows the error wrote at most the quota, all of it inside the jail's tmpfs
    swallow = _module(FILL.replace("{handler}", "raise RuntimeError(f'wrote {n} bytes')"), tail="")
    with SandboxWorker(swallow, limits) as w:
        with pytest.raises(SandboxError, match="wrote") as e:
            w.call("new", params={})
        wrote = int(e.value.reason.split("wrote ")[1].split()[0])
        assert 16 << 20 <= wrote <= 32 << 20, wrote
        assert _du(w.dir) < 1 << 20


def test_trace_eval_on_a_module_that_fills_its_directory_exits_1_and_the_host_does_not_grow(tmp_path):
    """Through the CLI: the module writes 600 MB on creation; the default 64 MB quota stops it, eval fails its
    check (exit 1) naming the quota, and nothing under the temp directory or the store grows."""
    import yaml

    from trace_cli.store import Store

    st = Store(tmp_path / "store")
    src = _module(FILL.replace("{handler}", "raise"))
    with st.writer("environment", "synthesize", {"fill": 1}, [], name="fill") as w:
        (w.path / "module.py").write_text(src)
        doc = {"kind": "environment", "version": 1, "name": "fill", "source": "module", "module": "module.py"}
        (w.path / "environment.yaml").write_text(yaml.safe_dump({**doc, "params": {}, "max_turns": 4}))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    store_before = _du(st.root)
    r = run_trace(
        "eval", "--env", "store://environment/fill", "--model", "policy:reference", "--seeds", "0:2",
        "--store", st.root, env={"TMPDIR": str(tmp)}, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1, (r.stdout, r.stderr[-2000:])
    assert "work directory quota exceeded (64 MB in all)" in r.stderr, r.stderr[-2000:]
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert list(tmp.iterdir()) == []  # the sandbox directory went with the run; it never held the data
    assert _du(st.root) - store_before < 1 << 20


# ----------------------------------------------------------------------------------------------- item 2
SLOW_MODULE = """import time
from trace_cli.envs.synthetic import TEMPLATES

def make_env(**params):
    env = TEMPLATES["precondition_verification"](**params)
    def reset(seed):
        time.sleep(600)
    env.reset = reset
    return env
"""


@pytest.fixture
def slow_env_store(module_env_store) -> Path:
    """A store with an environment artifact whose module hangs in reset(): `trace eval` on it sits in a
    sandbox call until it is killed."""
    return module_env_store("slow", SLOW_MODULE)


def _sandboxes(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("trace-sandbox-*"))


def _wait_for_a_busy_sandbox(tmp: Path, proc: subprocess.Popen) -> Path:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        found = [d for d in _sandboxes(tmp) if (d / "stderr.log").exists()]
        if found and processes_mentioning(str(found[0])):
            time.sleep(1.0)  # into reset()
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"the sandbox never started (exit {proc.poll()})")


def _trace(*args, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), TRACE_NO_PROGRESS="1")
    env.pop("TRACE_STORE", None)
    exe = Path(sys.executable).parent / "trace"
    return subprocess.Popen(
        [str(exe), *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_cli_killed_mid_eval_leaves_no_sandbox_directory_once_gc_ran(tmp_path, slow_env_store, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    store = slow_env_store
    evaluate = ("eval", "--env", "store://environment/slow", "--model", "policy:reference", "--seeds", "0:2")
    cli = _trace(*evaluate, "--store", store, tmp=tmp)
    sandbox = _wait_for_a_busy_sandbox(tmp, cli)
    cli.send_signal(sig)
    assert cli.wait(timeout=30) == -sig
    cli.communicate()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(sandbox)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_mentioning(str(sandbox))  # the jail died with the CLI either way
    if sig == signal.SIGTERM:  # cleaned up by the CLI itself
        assert _sandboxes(tmp) == []
    else:  # SIGKILL cannot be caught: the directory stays until gc
        assert _sandboxes(tmp) == [sandbox] and leftovers.stale_dirs(tmp) == [sandbox]
    # a live run's sandbox (another `trace eval`, still in its call) and unrelated directories are kept
    live = _trace(*evaluate, "--store", store, tmp=tmp)
    other = tmp / "trace-sandboxed-not-ours"
    other.mkdir()
    try:
        live_dir = _wait_for_a_busy_sandbox(tmp, live) if sig == signal.SIGTERM else None
        if live_dir is None:  # the killed run's directory is there too: find the new one
            deadline = time.monotonic() + 90
            while live_dir is None and time.monotonic() < deadline:
                new = [d for d in _sandboxes(tmp) if d != sandbox and processes_mentioning(str(d))]
                live_dir = new[0] if new else None
                time.sleep(0.1)
        assert live_dir is not None
        dry = run_trace("store", "gc", "--dry-run", "--store", store, env={"TMPDIR": str(tmp)})
        assert dry.returncode == 0, dry.stderr
        r = run_trace("store", "gc", "--store", store, env={"TMPDIR": str(tmp)})
        assert r.returncode == 0, r.stderr
        if sig == signal.SIGKILL:
            assert f"would remove {sandbox}" in dry.stdout, dry.stdout
            assert f"removed {sandbox}" in r.stdout and "1 sandbox directory" in r.stdout, r.stdout
        assert _sandboxes(tmp) == [live_dir] and other.is_dir()
    finally:
        live.kill()
        live.communicate()
    assert run_trace("store", "gc", "--store", store, env={"TMPDIR": str(tmp)}).returncode == 0
    assert _sandboxes(tmp) == [] and other.is_dir()


def test_a_sandbox_directory_whose_pid_was_reused_is_stale(tmp_path):
    d = tmp_path / "trace-sandbox-reused"
    d.mkdir()
    (d / leftovers.OWNER).write_text(f"{os.getppid()} 1\n")  # a live pid, another start time
    mine = tmp_path / "trace-sandbox-mine"
    mine.mkdir()
    leftovers.write_owner(mine)
    young = tmp_path / "trace-sandbox-no-owner-yet"
    young.mkdir()
    assert leftovers.stale_dirs(tmp_path) == [d]
    old = time.time() - leftovers.GRACE_S - 5
    os.utime(young, (old, old))
    assert leftovers.stale_dirs(tmp_path) == [young, d]


# ----------------------------------------------------------------------------------------------- item 4
@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64"), reason="syscall numbers for x86_64/aarch64"
)
def test_raw_syscalls_are_refused_even_with_ctypes_and_no_audit_hook(tmp_path, run_in_jail):
    """Defence in depth: hand the probe a working ctypes (a copy of the extension at a path of its own) and
    no audit hook; the seccomp filter alone refuses each call, with EPERM or ENOSYS."""
    origin = importlib.util.find_spec("_ctypes").origin
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(origin, lib / os.path.basename(origin))
    nr = jail._ARCH[os.uname().machine][1]
    calls = {
        "unshare": (nr["unshare"], 0x10000000),  # CLONE_NEWUSER
        "setns": (nr["setns"], -1, 0),
        "io_uring_setup": (nr["io_uring_setup"], 1, 0),
        "io_uring_enter": (nr["io_uring_enter"], -1, 0, 0, 0, 0, 0),
        "io_uring_register": (nr["io_uring_register"], -1, 0, 0, 0),
        "bpf": (nr["bpf"], 0, 0, 0),
        "keyctl": (nr["keyctl"], 0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
        "add_key": (nr["add_key"], 0, 0, 0, 0, -3),
        "request_key": (nr["request_key"], 0, 0, 0, 0),
        "perf_event_open": (nr["perf_event_open"], 0, 0, -1, -1, 0),
        "userfaultfd": (nr["userfaultfd"], 0),
        "memfd_create": (nr["memfd_create"], 0, 0),
        "mount": (nr["mount"], 0, 0, 0, 0, 0),
        "pidfd_getfd": (nr["pidfd_getfd"], 0, 0, 0),
        "memfd_secret": (nr["memfd_secret"], 0),
        "socket AF_VSOCK": (nr["socket"], 40, 1, 0),  # SOCK_STREAM
    }
    if os.uname().machine == "x86_64":
        calls["x32 getpid"] = (0x40000000 | 39,)
        calls["modify_ldt"] = (nr["modify_ldt"], 0, 0, 0)  # read the LDT
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(lib)!r})
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        out = {{'getpid': libc.syscall({39 if os.uname().machine == "x86_64" else 172})}}
        out['unix socket'] = libc.syscall({nr["socket"]}, 1, 1, 0)  # AF_UNIX: other families still work
        for name, args in {calls!r}.items():
            ctypes.set_errno(0)
            rc = libc.syscall(*[ctypes.c_long(a) for a in args])
            out[name] = (rc, ctypes.get_errno())
        print(repr(out))
    """)
    out = run_in_jail(probe, extra_ro=(str(lib),))
    assert out.pop("getpid") > 0  # the probe really had ctypes
    assert out.pop("unix socket") >= 0
    wrong = {k: v for k, v in out.items() if v[0] != -1 or v[1] not in (errno.EPERM, errno.ENOSYS)}
    assert wrong == {}, out


def test_no_copy_of_the_masked_extensions_loads_in_the_jail(run_in_jail):
    """Every `_ctypes`/`_posixsubprocess`/`_multiprocessing`/`_cffi_backend` extension module on the jail's
    filesystem (the system Python's too) reads as empty and does not load under any name."""
    probe = textwrap.dedent("""
        import glob, importlib.util, os, sys
        roots = ['/usr/lib', '/usr/lib64', '/usr/local/lib', sys.base_prefix + '/lib']
        names = ('_ctypes', '_posixsubprocess', '_multiprocessing', '_cffi_backend')
        found = {}
        for root in roots:
            for d in glob.glob(root + '/python*'):
                for dirpath, dirnames, files in os.walk(d):
                    dirpath_depth = dirpath[len(d):].count('/')
                    if dirpath_depth >= 1:  # lib-dynload, site-/dist-packages: extensions sit at their top
                        dirnames[:] = []
                    for f in files:
                        if f.split('.')[0] in names and f.endswith('.so'):
                            p = os.path.join(dirpath, f)
                            try:
                                spec = importlib.util.spec_from_file_location('evil', p)
                                importlib.util.module_from_spec(spec)
                                found[p] = 'LOADED'
                            except BaseException as e:
                                found[p] = type(e).__name__ + (' (empty)' if os.path.getsize(p) == 0 else '')
        print(repr(found))
    """)
    found = run_in_jail(probe)
    assert found, "no extension module found to try"
    assert {p: r for p, r in found.items() if not r.endswith("(empty)")} == {}, found
    system = [p for p in jail._masked_files() if not p.startswith(os.path.realpath(sys.base_prefix))]
    if os.path.isdir("/usr/lib") and any(Path("/usr/lib").glob("python3*/lib-dynload/_ctypes*.so")):
        assert system, "the system Python's _ctypes is not masked"


# ----------------------------------------------------------------------------------------------- item 5
def test_no_dev_shm_no_proc_mem_and_a_bounded_work_tmpfs(run_in_jail):
    probe = textwrap.dedent("""
        import os
        attempt('dev_shm', lambda: open('/dev/shm/x', 'wb').write(b'x'))
        attempt('dev', lambda: open('/dev/x', 'wb').write(b'x'))
        attempt('proc_self_mem', lambda: open('/proc/self/mem', 'r+b'))
        attempt('memfd', lambda: os.memfd_create('x'))
        def fill():
            with open('big', 'wb') as f:
                for _ in range(128):
                    f.write(b'x' * (1 << 20))
        attempt('fill_128_mb', fill)
        out['dev_null'] = open('/dev/null', 'w').write('ok')
        out['urandom'] = len(open('/dev/urandom', 'rb').read(8))
        print(repr(out))
    """)
    out = run_in_jail(probe)
    assert out.pop("dev_null") == 2 and out.pop("urandom") == 8  # the devices still work
    assert {k: v for k, v in out.items() if v == "ALLOWED"} == {}, out


# ----------------------------------------------------------------------------------------------- item 6
FORGE = """
    import json
    for fd in range(3, 12):
        try:
            os.write(fd, (json.dumps({'ok': True, 'result': {'handle': 99, 'name': 'forged', 'max_turns': 1}})
                          + '\\n').encode())
        except OSError:
            pass
"""

THREAD = """
    import threading, time
    def spin():
        while True:
            time.sleep(0.01)
    threading.Thread(target=spin, daemon=True).start()
"""


@pytest.mark.parametrize(
    "body, why",
    [(FORGE, "does not belong to new()"), (THREAD, "left 1 thread running after new()")],
    ids=["forged answer", "thread between calls"],
)
def test_forged_answers_and_threads_between_calls_are_violations(body, why):
    with SandboxWorker(_module(body), FAST) as w:
        with pytest.raises(SandboxViolation, match=why):
            w.call("new", params={})
        assert w.proc.poll() is not None  # killed
        with pytest.raises(SandboxViolation):
            w.call("ping")


def test_a_thread_that_ends_within_the_call_is_fine():
    body = """
        import threading
        t = threading.Thread(target=lambda: sum(range(1000)))
        t.start()
        t.join()
    """
    with SandboxWorker(_module(body), FAST) as w:
        assert w.call("new", params={})["handle"] == 1
        assert w.call("ping") == "pong"


def test_after_a_timeout_the_worker_is_replaced():
    src = _module("", tail=TEMPLATE_TAIL.replace("    return ", "    env = ") + SLOW_RESET)
    make = module_env_factory(src, {}, Limits(cpu_s=5.0, timeout_s=3.0, memory_mb=512))
    try:
        env = make()
        first = env.worker
        env.reset(0)
        with pytest.raises(SandboxViolation, match="timed out"):
            env.reset(1)
        assert first.proc.poll() is not None and first.dead
        again = make()
        assert again.worker is not first and again.worker.proc.poll() is None
        assert again.reset(0).task_id
    finally:
        make.close()


SLOW_RESET = """
    real = env.reset
    def reset(seed):
        if seed == 1:
            import time
            time.sleep(600)
        return real(seed)
    env.reset = reset
    return env
"""


# ----------------------------------------------------------------------------------------------- item 3
CRAFTED = """
    c = (lambda: 0).__code__
    bad = c.replace(co_code=bytes([100, 200, 83, 0]) * 2, co_consts=())  # LOAD_CONST 200 of no constants
    eval(bad)
"""
MARSHALLED = """
    import marshal
    c = (lambda: 0).__code__
    marshal.loads(marshal.dumps(c))
"""


@pytest.mark.parametrize("body", [CRAFTED, MARSHALLED], ids=["code.replace", "marshal.loads"])
def test_crafted_bytecode_is_refused_as_a_violation(body):
    v = check_module(
        _module(body), {}, FAST, reference_seeds=5, determinism_seeds=1, do_nothing_seeds=1, leakage_seeds=1
    )
    assert not v.accepted
    assert v.reason.startswith("blocked: building code objects from raw bytecode is not allowed"), v.reason


def test_a_crash_of_the_interpreter_is_reported_as_a_violation():
    body = "import faulthandler\nfaulthandler._sigsegv()\n"
    with SandboxWorker(_module(body), FAST) as w:
        with pytest.raises(SandboxViolation, match=r"crashed the interpreter \(SIGSEGV\) in new\(\)"):
            w.call("new", params={})
