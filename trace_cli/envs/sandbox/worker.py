"""Run an untrusted environment module (e.g. LLM-written) in a sandboxed process and drive it over a pipe.

The process is the child program `child.py`, started inside the OS sandbox of `jail.py` (bubblewrap:
namespaces, an unprivileged uid, a read-only minimal filesystem, no network, a seccomp filter against new
processes, death with the parent). The child sets its rlimits (memory, file size, total CPU) and an audit
hook (defence in depth), then loads the module. This side enforces the per-call budgets from outside: the
wall clock, and the CPU time of the sandbox's processes (read from /proc), killing the whole sandbox on excess;
between calls the sandbox is frozen (SIGSTOP), and answers are bounded (see `protocol.py`). Any blocked
action, limit hit or timeout kills the worker and raises `SandboxViolation` with a one-line reason.

Without a working bubblewrap, modules are refused (exit 2, with the fix) unless the caller explicitly allows
unsafe local execution (`--unsafe-local-exec`, or TRACE_UNSAFE_LOCAL_EXEC=1): then the child runs with the
rlimits, the audit hook and, where `unshare -n` works, a private network namespace only, and a warning says so.

Module contract: the module defines `make_env(**params)` (or a class `Env`) returning an object with
`name`, `max_turns`, `reset(seed)`, `step(action)`, `verify()`, `task_metadata()` (with `answer_values`) and
`reference_actions()`; return values are the dataclasses of `trace_cli.envs.base` or plain dicts with their
fields. The module may import `trace_cli.envs.*` (e.g. `SyntheticEnv`, the shop tools) and the stdlib. A target
world other than the shop (`params["world"]`, e.g. τ²-retail) is built and warmed in the child before its audit
hook, with exactly the world's packages mounted read-only for that preload (`trace_cli.envs.worlds.preload`): the
module then uses the world's already-imported modules and can import nothing more than without a world.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from trace_cli.config.schemas import load_schema
from trace_cli.envs.base import Observation, RewardBreakdown, StepResult
from trace_cli.envs.sandbox import jail, leftovers, protocol
from trace_cli.envs.sandbox.leftovers import SANDBOX_PREFIX, write_owner
from trace_cli.errors import CheckFailed, UsageError, a

MAX_SOURCE_BYTES = 256 * 1024
DEL_TIMEOUT_S = 5.0  # dropping an instance (at garbage collection) may wait at most this long on the module


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
    cpu_s: float  # CPU seconds per call
    memory_mb: int  # address space
    timeout_s: float  # wall clock per call
    total_cpu_s: int = 3600  # CPU seconds over the worker's life
    file_mb: int = 16  # largest file the module may write (in its own dir)
    work_mb: int = 64  # all files in its own dir together (a tmpfs of this size inside the jail)

    @classmethod
    def of(cls, block: Any = None) -> Limits:
        """The limits of a config's `sandbox` block, any key it lacks (none given: all) from synthesize.v1.json."""
        props = load_schema("config/synthesize.v1.json")["properties"]["sandbox"]["properties"]
        b = {k: p["default"] for k, p in props.items()} | dict(block or {})
        return cls(cpu_s=float(b["cpu_s"]), memory_mb=int(b["memory_mb"]), timeout_s=float(b["timeout_s"]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


UNSAFE_ENV = "TRACE_UNSAFE_LOCAL_EXEC"


def isolation(unsafe_local_exec: bool | None = None) -> str:
    """ "bwrap" when the OS sandbox works here; otherwise the weaker mode the user explicitly allowed
    ("unshare" or "audit-hook"), else a UsageError that says how to fix it."""
    if jail.available():
        return "bwrap"
    if unsafe_local_exec is None:
        unsafe_local_exec = os.environ.get(UNSAFE_ENV, "") not in ("", "0")
    if not unsafe_local_exec:
        raise UsageError(
            "no OS sandbox for untrusted environment modules: bubblewrap is missing, older than 0.7 (no --size) "
            "or cannot create namespaces here. Install it (apt-get install bubblewrap) or, to run the module with in-process guards only, "
            f"pass --unsafe-local-exec (or set {UNSAFE_ENV}=1)"
        )
    mode = "unshare" if _unshare_prefix() else "audit-hook"
    warnings.warn(
        f"running an untrusted environment module WITHOUT an OS sandbox ({mode} + audit hook only)",
        stacklevel=2,
    )
    return mode


@cache
def _unshare_prefix() -> tuple[str, ...]:
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


_CRASH_SIGNALS = {-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGILL, -signal.SIGFPE, -signal.SIGABRT}


class SandboxWorker:
    """One sandboxed process holding the module and any number of environment instances."""

    def __init__(
        self,
        source: str,
        limits: Limits | None = None,
        *,
        unsafe_local_exec: bool | None = None,
        world: str | None = None,
    ):
        """`world`: the target world the module's make_env gets (`params["world"]`); a world other than the shop
        is built in the child before its audit hook, with its packages mounted read-only (`envs.worlds.preload`)."""
        from trace_cli.envs.worlds import preload

        self.limits = limits or Limits.of()
        preload.check(world)
        if len(source.encode()) > MAX_SOURCE_BYTES:
            raise SandboxViolation(f"the module is larger than {MAX_SOURCE_BYTES // 1024} KB")
        try:
            compile(source, "module.py", "exec")
        except SyntaxError as e:
            raise SandboxError(f"the module does not compile: {e.msg} (line {e.lineno})") from None
        self.isolation = isolation(unsafe_local_exec)
        self.world = world
        sites, world_paths = preload.host_paths(world) if preload.needs_packages(world) else ((), ())
        leftovers.install_sigterm_cleanup()
        # base/ is private to this side; base/work is the module's only writable directory (in the jail a
        # tmpfs of work_mb mounted over it: the host directory stays empty); the module file and the stderr
        # log stay outside it (read-only inside the sandbox, invisible respectively); base/owner names this
        # process, so that `trace store gc` can remove the directory of a CLI that was killed (SIGKILL)
        self.dir = Path(tempfile.mkdtemp(prefix=SANDBOX_PREFIX))
        write_owner(self.dir)
        self.workdir = self.dir / "work"
        self.workdir.mkdir()
        self.module_path = self.dir / "module.py"
        self.module_path.write_text(source, encoding="utf-8")
        self._stderr = open(self.dir / "stderr.log", "wb")  # noqa: SIM115 - closed in close()
        child = [
            jail.interpreter(),
            "-I",
            "-S",
            "-B",
            str(Path(jail.__file__).with_name("child.py")),
            str(self.workdir),
            str(self.module_path),
            json.dumps({**self.limits.to_dict(), "answer_bytes": protocol.MAX_ANSWER_BYTES}),
            jail.package_root(),
        ]
        if world not in (None, "shop"):
            child.append(json.dumps({"world": world, "sites": list(sites)}))
        fd = None
        if self.isolation == "bwrap":
            fd = jail.seccomp_fd()
            cmd = [
                *jail.command(
                    str(self.workdir),
                    fd,
                    (str(self.module_path), *world_paths),
                    work_bytes=self.limits.work_mb << 20,
                    extra_masked=jail.masked_extensions(world_paths, preload.NATIVE.get(world, ()))
                    if world_paths
                    else (),
                ),
                *child,
            ]
        else:
            cmd = [*_unshare_prefix(), *child]
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                cwd=self.workdir,
                start_new_session=True,
                pass_fds=(fd,) if fd is not None else (),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            )
        finally:
            if fd is not None:
                os.close(fd)
        self._chan = protocol.Channel(self.proc.stdout.fileno())
        self._calls, self._last_op = 0, "start"
        self.received = 0  # bytes of every answer so far (the run's budget: protocol.RUN_ANSWER_BYTES)
        self.last_answer_bytes = 0
        self.dead: str | None = None
        self._finalizer = weakref.finalize(self, protocol.cleanup, self.proc, self.dir, self._stderr)
        leftovers.LIVE.add(self)
        self._startup = True
        try:  # wait until the child is ready, so that its start-up CPU is not charged to the first call
            self.call("ping")
        finally:
            self._startup = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        self.dead = self.dead or "closed"
        self._finalizer()

    def __enter__(self) -> SandboxWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kill(self) -> None:
        protocol.kill_group(self.proc)

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
        if self.isolation == "bwrap" and rc > 128:  # bwrap reports a signalled child as 128 + signal
            rc = -(rc - 128)
        tail = self.stderr_tail()
        if rc in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in tail:
            return f"CPU time limit exceeded ({self.limits.cpu_s:g} s per call) in {op}(); killed by {protocol.signal_name(rc)}"
        if rc == -signal.SIGXFSZ:
            return f"file size limit exceeded ({self.limits.file_mb} MB) in {op}()"
        if "MemoryError" in tail:
            return f"memory limit exceeded ({self.limits.memory_mb} MB) in {op}()"
        if rc in _CRASH_SIGNALS:
            return (
                f"the module crashed the interpreter ({protocol.signal_name(rc)}) in {op}(): crafted bytecode or "
                "memory corruption, which a sandboxed module is not allowed"
            )
        v = protocol.violation_in(self._chan.pending()) if rc == protocol.VIOLATION_EXIT else None
        if v:
            return f"blocked: {v} (before {op}() could answer)"
        last = tail.splitlines()[-1] if tail else ""
        how = protocol.signal_name(rc) if rc < 0 else f"exit code {rc}"
        return f"the module process ended during {op}() ({how}){': ' + last if last else ''}"

    # -- calls -------------------------------------------------------------------------------------------
    def call(self, op: str, *, timeout_s: float | None = None, **kw: Any) -> Any:
        """One request and its answer, within the per-call limits (`timeout_s`: a shorter wall clock)."""
        if self.dead:
            raise SandboxViolation(self.dead)
        request = (json.dumps({"op": op, **kw}) + "\n").encode()
        self._thaw(op)
        cpu0 = None if self._startup else protocol.tree_cpu(self.proc.pid)
        self._calls += 1
        limit = self.limits.timeout_s if timeout_s is None else min(timeout_s, self.limits.timeout_s)
        deadline = time.monotonic() + limit  # the whole call: sending the request and reading its answer
        try:
            try:
                protocol.send(self.proc.stdin.fileno(), request, deadline, self._cpu_check(op, cpu0))
            except protocol.Unread:
                self._die(
                    f"timed out: the module does not read its requests ({op}() not taken within {limit:g} s)"
                )
            except (BrokenPipeError, OSError):
                self._die(self._exit_reason(op))
            reply = self._answer(op, cpu0, deadline, limit)
        except BaseException:
            # Ctrl-C, SIGTERM or any error in the middle of a call leaves the pipe in an unknown state (half a
            # request written, an answer unread): the worker is of no further use, and nothing may wait on it
            if not self.dead:
                self.dead = f"interrupted during {op}()"
                self._kill()
            raise
        extra = self._stray_threads()
        if extra:
            self._die(
                f"the module left {extra} thread{'s' if extra != 1 else ''} running after {op}(); "
                "a sandboxed module may not run between calls"
            )
        protocol.signal_tree(self.proc.pid, signal.SIGSTOP)  # nothing of the module runs until the next call
        self._last_op = op
        if not reply.get("ok"):
            if reply.get("etype") == "MemoryError":
                self._die(f"memory limit exceeded ({self.limits.memory_mb} MB) in {op}()")
            if reply.get("errno") == errno.ENOSPC and self.isolation == "bwrap":
                self._die(f"work directory quota exceeded ({self.limits.work_mb} MB in all) in {op}()")
            raise SandboxError(
                f"the module raised {reply.get('etype')} in {op}(): {reply.get('error')}",
                reply.get("trace", ""),
            )
        return reply.get("result")

    def _thaw(self, op: str) -> None:
        """Check that nothing arrived since the last answer, then let the sandbox run again."""
        waiting = self._chan.pending()
        if waiting:
            v = protocol.violation_in(waiting)
            where = f"between calls (after {self._last_op}(), before {op}())"
            self._die(
                f"blocked: {v} ({where})"
                if v
                else f"the module wrote an answer {where}: a forged or stale protocol message"
            )
        protocol.signal_tree(self.proc.pid, signal.SIGCONT)

    def _cpu_check(self, op: str, cpu0: float | None):
        def over_cpu() -> None:  # the same grace as a kernel RLIMIT_CPU armed at whole seconds: 1 s over
            if cpu0 is not None and protocol.tree_cpu(self.proc.pid) - cpu0 > self.limits.cpu_s + 1.0:
                self._die(f"CPU time limit exceeded ({self.limits.cpu_s:g} s per call) in {op}()")

        return over_cpu

    def _answer(self, op: str, cpu0: float | None, deadline: float, limit: float) -> dict[str, Any]:
        try:
            line = self._chan.read_line(deadline, self._cpu_check(op, cpu0))
            if line is None:
                self._die(self._exit_reason(op))
            self.last_answer_bytes = len(line)
            self.received += len(line)
            if self.received > protocol.RUN_ANSWER_BYTES:
                self._die(
                    f"the module's answers exceed the run's budget ({protocol.RUN_ANSWER_BYTES >> 20} MB of "
                    f"answers in all) in {op}()"
                )
            reply = protocol.decode(line)
        except TimeoutError:
            self._die(f"timed out: no answer to {op}() within {limit:g} s (an endless loop?)")
        except protocol.ProtocolError as e:
            self._die(f"{e} (in {op}())")
        if reply.get("too_large"):  # the child's loop refuses to send what this side would refuse to read
            self._die(f"the answer is larger than {protocol.MAX_ANSWER_BYTES >> 20} MB (in {op}())")
        if isinstance(reply.get("violation"), str):  # the audit hook's report (it ends the process)
            self._die(f"blocked: {reply['violation']} (in {op}())")
        if reply.get("n") != self._calls:
            self._die(
                f"the module wrote an answer that does not belong to {op}() (a forged or stale protocol message)"
            )
        if self._chan.buf:
            self._die(f"the module wrote more than one answer to {op}() (a forged protocol message)")
        return reply

    def _stray_threads(self) -> int:
        """Threads beyond one per process in the sandbox's process tree, after a short grace for threads
        that were joined and are just ending; 0 when none stays."""
        deadline = time.monotonic() + 0.3
        while True:
            extra = protocol.tree_threads(self.proc.pid)
            if extra <= 0 or time.monotonic() >= deadline:
                return max(extra, 0)
            time.sleep(0.02)

    def _die(self, reason: str):
        self.dead = reason
        self._kill()
        raise SandboxViolation(reason)


def _only(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    if not isinstance(d, dict):
        raise SandboxError(f"the module returned {type(d).__name__} where {a(cls.__name__)} was expected")
    return {k: v for k, v in d.items() if k in names}


class SandboxedEnv:
    """An Environment whose implementation lives in a sandbox worker (one instance = one handle)."""

    def __init__(self, worker: SandboxWorker, params: dict[str, Any] | None = None):
        self.worker = worker
        info = worker.call("new", params=dict(params or {}))
        self.handle = info["handle"]
        self.name = info["name"]
        self.max_turns = info["max_turns"]
        self.episode_bytes = 0  # answers since the last reset (the budget: protocol.EPISODE_ANSWER_BYTES)

    def _call(self, op: str, **kw: Any) -> Any:
        w = self.worker
        result = w.call(op, handle=self.handle, **kw)
        self.episode_bytes += w.last_answer_bytes
        if self.episode_bytes > protocol.EPISODE_ANSWER_BYTES:
            w._die(
                f"the module's answers exceed an episode's budget ({protocol.EPISODE_ANSWER_BYTES >> 20} MB of "
                f"answers from one reset to the next) in {op}()"
            )
        return result

    def reset(self, seed: int) -> Observation:
        self.episode_bytes = 0
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
        if w is not None and not w.dead and w.proc.poll() is None and not sys.is_finalizing():
            try:
                w.call("del", handle=self.handle, timeout_s=DEL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort at garbage collection
                pass


_WORKERS: list[SandboxWorker] = []  # strong references: the factories' workers live until exit


def module_env_factory(
    source: str,
    params: dict[str, Any] | None = None,
    limits: Limits | None = None,
    *,
    unsafe_local_exec: bool | None = None,
    world: str | None = None,
):
    """A zero-argument factory of SandboxedEnvs sharing one worker (started on first use); `world` (default:
    the params' `world`) is the target world the worker preloads."""
    world = world or (params or {}).get("world")
    leftovers.install_sigterm_cleanup()  # here too: the worker itself may start on a rollout thread
    box: dict[str, SandboxWorker] = {}

    def make() -> SandboxedEnv:
        w = box.get("w")
        if w is None or w.dead:
            w = box["w"] = SandboxWorker(source, limits, unsafe_local_exec=unsafe_local_exec, world=world)
            _WORKERS.append(w)
        return SandboxedEnv(w, params)

    make.close = lambda: box["w"].close() if "w" in box else None  # type: ignore[attr-defined]
    return make


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
    reference_seeds: int,
    determinism_seeds: int,
    do_nothing_seeds: int,
    leakage_seeds: int,
    unsafe_local_exec: bool | None = None,
    world: str | None = None,
) -> ModuleVerdict:
    """Load the module in a sandbox and run the template checks on it; never raises for a bad module. The seed
    counts are the synthesize config's `checks` (its schema states their defaults); `world` (default: the
    params' `world`) is the target world the worker preloads."""
    from trace_cli.envs.synthetic.checks import run_checks

    world = world or (params or {}).get("world")
    try:
        worker = SandboxWorker(source, limits, unsafe_local_exec=unsafe_local_exec, world=world)
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
        return ModuleVerdict(False, e.reason, network_isolation=worker.isolation)
    except Exception as e:  # noqa: BLE001 - malformed answers (wrong types) are the module's fault
        return ModuleVerdict(
            False,
            f"the module's answers are malformed: {type(e).__name__}: {e}",
            network_isolation=worker.isolation,
        )
    finally:
        worker.close()
    failed = [r for r in results if not r.passed]
    reason = "accepted" if not failed else f"check {failed[0].name} failed: {failed[0].message}"
    return ModuleVerdict(not failed, reason, [r.to_dict() for r in results], worker.isolation)
