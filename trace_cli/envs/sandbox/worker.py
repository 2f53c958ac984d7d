"""Run an untrusted environment module (e.g. LLM-written) in a subprocess sandbox and drive it over a pipe.

Isolation, all stdlib:
  * a separate `python -I -B` process in a fresh temp dir (its working directory), with resource limits:
    RLIMIT_AS (memory), RLIMIT_CPU (a CPU-second budget per call, re-armed before each call, plus a hard
    total), RLIMIT_FSIZE (file size), no core dumps; and a wall-clock timeout per call enforced by the parent,
    which kills the process group;
  * no network: the child runs in its own network namespace (`unshare -n`, or `unshare -rn` without root)
    when `unshare` works, and in any case an audit hook (`sys.addaudithook`) rejects socket creation and
    network modules;
  * the same audit hook rejects writes (open for writing, remove, rename, mkdir, chmod, ...) outside the temp
    dir, reads outside the Python installation / trace_cli package / temp dir, starting processes, signals,
    ctypes and changing resource limits.
Any blocked action, limit hit or timeout kills the worker and raises `SandboxViolation` with a one-line reason.
Audit hooks guard against accidents and naive misbehaviour; they are not a security boundary against code
written to escape them (the namespace and rlimits are the OS-level parts).

Module contract: the module defines `make_env(**params)` (or a class `Env`) returning an object with
`name`, `max_turns`, `reset(seed)`, `step(action)`, `verify()`, `task_metadata()` (with `answer_values`) and
`reference_actions()`; return values are the dataclasses of `trace_cli.envs.base` or plain dicts with their
fields. The module may import `trace_cli.envs.*` (e.g. `SyntheticEnv`, the shop tools) and the stdlib.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from trace_cli.envs.base import Observation, RewardBreakdown, StepResult
from trace_cli.errors import CheckFailed

MAX_SOURCE_BYTES = 256 * 1024


class SandboxViolation(CheckFailed):
    """The module did something the sandbox does not allow, or hit a limit; `reason` says what."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SandboxError(CheckFailed):
    """The module raised an ordinary exception (a bug in it, not a violation)."""

    def __init__(self, reason: str, trace: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.trace = trace


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 10.0  # CPU seconds per call
    memory_mb: int = 1024  # address space
    timeout_s: float = 30.0  # wall clock per call
    total_cpu_s: int = 3600  # CPU seconds over the worker's life
    file_mb: int = 16  # largest file the module may write (in its own dir)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The child: limits, then trusted imports, then the audit hook, then the module, then the request loop.
CHILD = r"""
import json, os, resource, sys, traceback

def _main():
    workdir, module_path, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    os.chdir(workdir)
    mem = int(cfg["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsz = int(cfg["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsz, fsz))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    total = int(cfg["total_cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (total, total + 1))
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the module's prints go to stderr, never into the protocol
    requests = sys.stdin
    import collections, copy, dataclasses, functools, hashlib, importlib.util, inspect, itertools, marshal, math
    import random, re, string, typing
    import trace_cli
    import trace_cli.envs.base, trace_cli.envs.validation, trace_cli.envs.shop
    import trace_cli.envs.synthetic.base, trace_cli.envs.synthetic.common
    real = os.path.realpath
    wd = real(workdir)
    read_roots = {wd, real(os.path.dirname(trace_cli.__file__)), "/dev/null", "/dev/urandom"}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        read_roots.add(real(p))
    read_roots |= {real(p) for p in sys.path if p and os.path.isdir(p)}
    state = {"trusted": False}
    violations = []
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    net_modules = {"socket", "_socket", "ssl", "_ssl", "http", "urllib.request", "ftplib", "smtplib", "telnetlib",
                   "xmlrpc", "asyncio"}
    proc_modules = {"subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "ctypes",
                    "_ctypes", "cffi"}
    path_events = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link",
                   "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.mkfifo",
                   "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.move", "shutil.chown", "os.setxattr",
                   "os.removexattr"}

    def inside(path, roots):
        try:
            p = real(os.fsdecode(path))
        except Exception:
            return False
        return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots)

    def hook(event, args):
        if state["trusted"]:
            return
        reason = None
        if event.startswith("socket."):
            reason = f"network access is not allowed ({event})"
        elif event == "import":
            top = str(args[0])
            if top in net_modules or top.split(".")[0] in net_modules:
                reason = f"network access is not allowed (import {top})"
            elif top.split(".")[0] in proc_modules:
                reason = f"module {top} is not allowed (processes, ctypes)"
        elif event == "open":
            path, mode, flags = (list(args) + [None, None])[:3]
            if isinstance(path, (str, bytes, os.PathLike)):
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and bool(flags & write_flags))
                if writing and not inside(path, [wd]):
                    reason = f"writing outside the sandbox directory is not allowed ({os.fsdecode(path)})"
                elif not writing and not inside(path, read_roots):
                    reason = f"reading outside the sandbox is not allowed ({os.fsdecode(path)})"
        elif event in path_events:
            for p in args[:2]:
                if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, [wd]):
                    reason = f"changing files outside the sandbox directory is not allowed ({event} {os.fsdecode(p)})"
                    break
        elif (event.startswith(("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "pty.",
                                "ctypes.", "_posixsubprocess"))
              or event in ("os.system", "os.kill", "os.killpg", "signal.pthread_kill", "os.forkpty")):
            reason = f"starting processes, signals and ctypes are not allowed ({event})"
        elif event in ("resource.setrlimit", "resource.prlimit"):
            reason = "changing resource limits is not allowed"
        if reason is not None:
            violations.append(reason)
            raise PermissionError("sandbox: " + reason)

    sys.addaudithook(hook)
    module = None
    envs = {}

    def plain(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.asdict(x)
        return x

    def load():
        nonlocal module
        if module is None:
            spec = importlib.util.spec_from_file_location("sandboxed_env_module", module_path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            module = mod
        return module

    def dispatch(req):
        op = req["op"]
        if op == "ping":
            return "pong"
        if op == "new":
            mod = load()
            make = getattr(mod, "make_env", None) or getattr(mod, "Env", None)
            if make is None:
                raise AttributeError("the module defines neither make_env(**params) nor a class Env")
            env = make(**(req.get("params") or {}))
            h = len(envs) + 1
            while h in envs:
                h += 1
            envs[h] = env
            return {"handle": h, "name": str(getattr(env, "name", "module")),
                    "max_turns": int(getattr(env, "max_turns", 12))}
        env = envs[req["handle"]]
        if op == "del":
            envs.pop(req["handle"], None)
            return None
        if op == "reset":
            return plain(env.reset(int(req["seed"])))
        if op == "step":
            return plain(env.step(req["action"]))
        if op == "verify":
            return plain(env.verify())
        if op == "task_metadata":
            return plain(env.task_metadata())
        if op == "reference_actions":
            return [plain(a) for a in env.reference_actions()]
        raise ValueError(f"unknown op {op!r}")

    for line in requests:
        req = json.loads(line)
        state["trusted"] = True
        ru = resource.getrusage(resource.RUSAGE_SELF)
        soft = min(int(ru.ru_utime + ru.ru_stime + float(cfg["cpu_s"])) + 1, total)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, total + 1))
        state["trusted"] = False
        try:
            reply = {"ok": True, "result": dispatch(req)}
        except MemoryError:
            reply = {"ok": False, "etype": "MemoryError", "error": "memory limit exceeded"}
        except BaseException as e:
            reply = {"ok": False, "etype": type(e).__name__, "error": str(e)[:500],
                     "trace": traceback.format_exc()[-3000:]}
        reply["violations"] = list(violations)
        try:
            text = json.dumps(reply, default=str)
        except BaseException as e:
            text = json.dumps({"ok": False, "etype": type(e).__name__, "error": f"unserialisable result: {e}",
                               "violations": list(violations)})
        proto.write(text + "\n")

_main()
"""


@cache
def isolation_prefix() -> tuple[str, ...]:
    """`unshare -n` (root) or `unshare -rn` (user namespace) when it works here, else nothing."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    for args in ((exe, "-n"), (exe, "-rn")):
        try:
            r = subprocess.run([*args, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return args
    return ()


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class SandboxWorker:
    """One sandboxed process holding the module and any number of environment instances."""

    def __init__(self, source: str, limits: Limits | None = None):
        self.limits = limits or Limits()
        if len(source.encode()) > MAX_SOURCE_BYTES:
            raise SandboxViolation(f"the module is larger than {MAX_SOURCE_BYTES // 1024} KB")
        try:
            compile(source, "module.py", "exec")
        except SyntaxError as e:
            raise SandboxError(f"the module does not compile: {e.msg} (line {e.lineno})") from None
        self.dir = Path(tempfile.mkdtemp(prefix="trace-sandbox-"))
        self.module_path = self.dir / "module.py"
        self.module_path.write_text(source, encoding="utf-8")
        self._stderr = open(self.dir / "stderr.log", "wb")  # noqa: SIM115 - closed in close()
        self.network_isolation = "unshare" if isolation_prefix() else "audit-hook"
        cmd = [
            *isolation_prefix(),
            sys.executable,
            "-I",
            "-B",
            "-c",
            CHILD,
            str(self.dir),
            str(self.module_path),
            json.dumps(self.limits.to_dict()),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=self.dir,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        )
        self._buf = b""
        self.dead: str | None = None
        self._finalizer = weakref.finalize(self, _cleanup, self.proc, self.dir, self._stderr)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> SandboxWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kill(self) -> None:
        _kill_group(self.proc)

    def stderr_tail(self, n: int = 600) -> str:
        try:
            self._stderr.flush()
            data = (self.dir / "stderr.log").read_bytes()[-n:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def _exit_reason(self, op: str) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            rc = self.proc.wait()
        tail = self.stderr_tail()
        if rc in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in tail:
            return f"CPU time limit exceeded ({self.limits.cpu_s:g} s per call) in {op}(); killed by {_signal_name(rc)}"
        if rc == -signal.SIGXFSZ:
            return f"file size limit exceeded ({self.limits.file_mb} MB) in {op}()"
        if "MemoryError" in tail:
            return f"memory limit exceeded ({self.limits.memory_mb} MB) in {op}()"
        last = tail.splitlines()[-1] if tail else ""
        how = _signal_name(rc) if rc < 0 else f"exit code {rc}"
        return f"the module process ended during {op}() ({how}){': ' + last if last else ''}"

    # -- calls -------------------------------------------------------------------------------------------
    def call(self, op: str, **kw: Any) -> Any:
        if self.dead:
            raise SandboxViolation(self.dead)
        try:
            self.proc.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._die(self._exit_reason(op))
        line = self._read_line(op)
        reply = json.loads(line)
        if reply.get("violations"):
            self._die(f"blocked: {reply['violations'][0]} (in {op}())")
        if not reply.get("ok"):
            if reply.get("etype") == "MemoryError":
                self._die(f"memory limit exceeded ({self.limits.memory_mb} MB) in {op}()")
            raise SandboxError(
                f"the module raised {reply.get('etype')} in {op}(): {reply.get('error')}",
                reply.get("trace", ""),
            )
        return reply.get("result")

    def _die(self, reason: str):
        self.dead = reason
        self._kill()
        raise SandboxViolation(reason)

    def _read_line(self, op: str) -> str:
        import time

        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.limits.timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self._die(
                    f"timed out: no answer to {op}() within {self.limits.timeout_s:g} s (an endless loop?)"
                )
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._die(self._exit_reason(op))
            self._buf += chunk
            if len(self._buf) > 64 << 20:
                self._die(f"the answer to {op}() is larger than 64 MB")
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # our own child's session (start_new_session=True)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _cleanup(proc: subprocess.Popen, directory: Path, stderr) -> None:
    _kill_group(proc)
    for f in (proc.stdin, proc.stdout):
        try:
            if f:
                f.close()
        except OSError:
            pass
    try:
        stderr.close()
    except OSError:
        pass
    shutil.rmtree(directory, ignore_errors=True)


def _only(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    if not isinstance(d, dict):
        raise SandboxError(f"the module returned {type(d).__name__} where a {cls.__name__} was expected")
    return {k: v for k, v in d.items() if k in names}


class SandboxedEnv:
    """An Environment whose implementation lives in a sandbox worker (one instance = one handle)."""

    def __init__(self, worker: SandboxWorker, params: dict[str, Any] | None = None):
        self.worker = worker
        info = worker.call("new", params=dict(params or {}))
        self.handle = info["handle"]
        self.name = info["name"]
        self.max_turns = info["max_turns"]

    def _call(self, op: str, **kw: Any) -> Any:
        return self.worker.call(op, handle=self.handle, **kw)

    def reset(self, seed: int) -> Observation:
        return Observation(**_only(Observation, self._call("reset", seed=seed)))

    def step(self, action: dict[str, Any]) -> StepResult:
        return StepResult(**_only(StepResult, self._call("step", action=action)))

    def verify(self) -> RewardBreakdown:
        return RewardBreakdown(**_only(RewardBreakdown, self._call("verify")))

    def task_metadata(self) -> dict[str, Any]:
        return self._call("task_metadata")

    def reference_actions(self) -> list[dict[str, Any]]:
        return self._call("reference_actions")

    def __del__(self) -> None:
        w = getattr(self, "worker", None)
        if w is not None and not w.dead and w.proc.poll() is None:
            try:
                w.call("del", handle=self.handle)
            except Exception:  # noqa: BLE001 - best effort at garbage collection
                pass


_WORKERS: list[SandboxWorker] = []


def module_env_factory(source: str, params: dict[str, Any] | None = None, limits: Limits | None = None):
    """A zero-argument factory of SandboxedEnvs sharing one worker (started on first use)."""
    box: dict[str, SandboxWorker] = {}

    def make() -> SandboxedEnv:
        w = box.get("w")
        if w is None or w.dead:
            w = box["w"] = SandboxWorker(source, limits)
            _WORKERS.append(w)
        return SandboxedEnv(w, params)

    make.close = lambda: box["w"].close() if "w" in box else None  # type: ignore[attr-defined]
    return make


@atexit.register
def _close_all() -> None:
    for w in _WORKERS:
        w.close()


@dataclass
class ModuleVerdict:
    accepted: bool
    reason: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    network_isolation: str = ""


def check_module(
    source: str,
    params: dict[str, Any] | None = None,
    limits: Limits | None = None,
    *,
    reference_seeds: int = 100,
    determinism_seeds: int = 10,
    do_nothing_seeds: int = 50,
    leakage_seeds: int = 50,
) -> ModuleVerdict:
    """Load the module in a sandbox and run the template checks on it; never raises for a bad module."""
    from trace_cli.envs.synthetic.checks import run_checks

    try:
        worker = SandboxWorker(source, limits)
    except (SandboxViolation, SandboxError) as e:
        return ModuleVerdict(False, e.reason)
    try:
        results = run_checks(
            lambda: SandboxedEnv(worker, params),
            reference_seeds=reference_seeds,
            determinism_seeds=determinism_seeds,
            do_nothing_seeds=do_nothing_seeds,
            leakage_seeds=leakage_seeds,
        )
    except (SandboxViolation, SandboxError) as e:
        return ModuleVerdict(False, e.reason, network_isolation=worker.network_isolation)
    except Exception as e:  # noqa: BLE001 - malformed answers (wrong types) are the module's fault
        return ModuleVerdict(
            False,
            f"the module's answers are malformed: {type(e).__name__}: {e}",
            network_isolation=worker.network_isolation,
        )
    finally:
        worker.close()
    failed = [r for r in results if not r.passed]
    reason = "accepted" if not failed else f"check {failed[0].name} failed: {failed[0].message}"
    return ModuleVerdict(not failed, reason, [r.to_dict() for r in results], worker.network_isolation)
