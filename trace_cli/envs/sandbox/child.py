"""The sandboxed child: loads one untrusted environment module and answers JSON requests on a pipe.

Run as a script (never imported by the parent): `python -I -S -B child.py WORKDIR MODULE LIMITS_JSON PKG_ROOT
[WORLD_JSON]`; WORLD_JSON ({"world": name, "sites": [site-packages directories]}) names the module's target world,
which is built and warmed before the hook (`trace_cli.envs.worlds.preload`).
Inside the OS sandbox (see `jail.py`) it is the only process, as an unprivileged uid, with a read-only view
of the Python installation and the trace_cli package, a private writable WORKDIR, no network, and a seccomp
filter that refuses new processes. This program adds, before the untrusted module is imported:

* resource limits: address space, file size, no core dumps, a hard total CPU budget (the parent enforces the
  per-call CPU budget and the wall clock from outside, so nothing here ever has to be re-armed);
* an audit hook as defence in depth. It has no on/off switch and keeps no state that the module could
  reach and change: its allow-lists are frozensets captured in a closure, and the first blocked action is
  reported straight to the protocol descriptor and ends the process (`os._exit`), so a module that catches
  the PermissionError is still rejected. Introspection that could reach the hook (frames, gc object search,
  changing function code) is blocked too, and so are sub-interpreters (they run under no hook). The jail,
  not this hook, is the security boundary: the hook runs in the module's own interpreter;
* no bytecode cache: every import after the hook compiles from source (no .pyc is looked for or loaded);
* after every call, any signal handler or interval timer the module left is undone and reported as a
  violation (with the parent freezing the process between calls, nothing of the module runs then).
"""

import json
import os
import resource
import sys
import traceback

VIOLATION_EXIT = 86


def _limits(cfg):
    mem = int(cfg["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsz = int(cfg["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsz, fsz))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    total = int(cfg["total_cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (total, total + 1))


def _trusted_imports():
    """Everything the module may use is imported before the hook: later imports only read these files."""
    import collections  # noqa: F401
    import copy  # noqa: F401
    import dataclasses  # noqa: F401
    import functools  # noqa: F401
    import hashlib  # noqa: F401
    import importlib.util  # noqa: F401
    import inspect  # noqa: F401
    import itertools  # noqa: F401
    import marshal  # noqa: F401
    import math  # noqa: F401
    import random  # noqa: F401
    import re  # noqa: F401
    import string  # noqa: F401
    import typing  # noqa: F401

    import trace_cli
    import trace_cli.envs.base
    import trace_cli.envs.shop
    import trace_cli.envs.synthetic.base
    import trace_cli.envs.synthetic.common
    import trace_cli.envs.validation  # noqa: F401

    return os.path.dirname(trace_cli.__file__)


_NET = frozenset(
    {"socket", "_socket", "ssl", "_ssl", "http", "ftplib", "smtplib", "telnetlib", "xmlrpc", "asyncio"}
)
_PROC = frozenset(
    {
        "subprocess",
        "_posixsubprocess",
        "multiprocessing",
        "_multiprocessing",
        "pty",
        "ctypes",
        "_ctypes",
        "cffi",
    }
)
_PATH_EVENTS = frozenset(
    {
        "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
        "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree",
        "shutil.copyfile", "shutil.move", "shutil.chown", "os.setxattr", "os.removexattr",
    }
)  # fmt: skip
_PROC_PREFIXES = (
    "subprocess.",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "pty.",
    "ctypes.",
    "_posixsubprocess",
)
_PROC_EVENTS = frozenset({"os.system", "os.kill", "os.killpg", "signal.pthread_kill", "os.forkpty"})
# Introspection that could find this hook's function objects (gc searches, another thread's frames) or run
# module code while the hook runs (trace/profile functions). Plain frame access (`sys._getframe`, tracebacks)
# stays allowed: namedtuple, typing and traceback need it, and no frame ever holds anything that changes the
# hook, because the hook keeps only immutable values and never runs module code.
_INTROSPECTION = frozenset(
    {
        "sys._current_frames",
        "sys._current_exceptions",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.setprofile",
        "sys.settrace",
        "sys._setprofileallthreads",
        "sys._settraceallthreads",
        "sys.addaudithook",
    }
)


# raw bytecode (CodeType(...), code.replace, marshal) is refused in every caller: imports after the hook compile
# from source (the child turns the bytecode cache off), and trusted code never unmarshals anything
_CODE_EVENTS = frozenset({"code.__new__", "marshal.loads", "marshal.load"})
# sub-interpreters run code under no audit hook at all, and CPython's test modules can start one (or poke
# at memory): refused by name and, whatever module starts one, when the interpreter is created
_SUBINTERP = frozenset(
    {
        "_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_interpchannels", "_interpqueues",
        "_testcapi", "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_testbuffer",
        "_testimportmultiple", "_testclinic", "_ctypes_test", "_xxtestfuzz",
    }
)  # fmt: skip


def _make_hook(proto_fd, workdirs, read_roots):
    """The audit hook. Everything it uses is bound here, in its closure: the module can rebind module
    globals, builtins and `os` functions, but not these (no function object of the hook is reachable)."""
    import pathlib

    _write, _exit, _dumps, _fsdecode, _getcwd = os.write, os._exit, json.dumps, os.fsdecode, os.getcwd
    _type, _str, _int, _bytes, _any, _len, _tuple, _bool = type, str, int, bytes, any, len, tuple, bool
    net, proc, path_events, proc_prefixes, proc_events, introspection, subinterp = (
        _NET,
        _PROC,
        _PATH_EVENTS,
        _PROC_PREFIXES,
        _PROC_EVENTS,
        _INTROSPECTION,
        _SUBINTERP,
    )
    pathlib_types = (pathlib.PosixPath, pathlib.PurePosixPath)
    code_events = _CODE_EVENTS
    function_parts = ("__code__", "__closure__")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    wd = _tuple(workdirs)
    roots = _tuple(read_roots)

    def as_text(path):
        # only exact str/bytes/pathlib paths: a module-defined __fspath__ would run module code in the hook
        if _type(path) is _str:
            return path
        if _type(path) is _bytes:
            return _fsdecode(path)
        if _type(path) in pathlib_types:
            return _str(path)
        return None

    def normalized(text):
        # string normalisation against the process's real working directory (the C getcwd bound above, not
        # the sandbox directory it should be: os.chdir is blocked, but a way around that must not make
        # relative paths pass); no other filesystem call, so patched os functions cannot steer it. Symlinks
        # cannot point out: creating one that does is blocked, and the OS sandbox is the boundary anyway.
        parts = []
        if not text.startswith("/"):
            try:
                text = _getcwd() + "/" + text
            except OSError:  # the working directory is gone: nothing relative is inside anything
                return "/"
        for part in text.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def inside(path, allowed):
        text = as_text(path)
        if text is None:
            return False
        p = normalized(text)
        return _any(p == r or p.startswith(r.rstrip("/") + "/") for r in allowed)

    def reason_for(event, args):
        if event.startswith("socket."):
            return f"network access is not allowed ({event})"
        if event == "import":
            top = args[0] if _type(args[0]) is _str else "?"
            if top in net or top.split(".")[0] in net or top == "urllib.request":
                return f"network access is not allowed (import {top})"
            if top.split(".")[0] in proc:
                return f"module {top} is not allowed (processes, ctypes)"
            if top.split(".")[0] in subinterp:
                return f"module {top} is not allowed (sub-interpreters and CPython's test modules)"
            return None
        if event == "cpython.PyInterpreterState_New":
            return "starting a sub-interpreter is not allowed (it runs without this audit hook)"
        if event == "open":
            path, mode, flags = (
                args[0],
                args[1] if _len(args) > 1 else None,
                args[2] if _len(args) > 2 else None,
            )
            if _type(path) is not _int:  # an int is an already open descriptor
                writing = (_type(mode) is _str and _any(c in mode for c in "wax+")) or (
                    _type(flags) is _int and _bool(flags & write_flags)
                )
                if writing and not inside(path, wd):
                    return f"writing outside the sandbox directory is not allowed ({as_text(path)})"
                if not writing and not inside(path, roots):
                    return f"reading outside the sandbox is not allowed ({as_text(path)})"
            return None
        if event in path_events:
            for p in args[:2]:
                if _type(p) is not _int and p is not None and not inside(p, wd):
                    return (
                        f"changing files outside the sandbox directory is not allowed ({event} {as_text(p)})"
                    )
            return None
        if event in ("os.chdir", "os.fchdir", "os.chroot"):
            return f"changing the working directory is not allowed ({event})"
        if event.startswith(proc_prefixes) or event in proc_events:
            return f"starting processes, signals and ctypes are not allowed ({event})"
        if event in ("resource.setrlimit", "resource.prlimit"):
            return "changing resource limits is not allowed"
        if event in introspection:
            return f"introspection of the interpreter is not allowed ({event})"
        if event == "object.__setattr__" and _len(args) > 1 and args[1] in function_parts:
            return f"changing a function's code is not allowed ({args[1]})"
        if event in code_events:
            # hand-made bytecode (CodeType(...), code.replace, marshal) can crash the interpreter or read
            # and write its memory; source that the compiler turns into bytecode stays allowed
            return f"building code objects from raw bytecode is not allowed ({event})"
        return None

    def hook(event, args):
        reason = reason_for(event, args)
        if reason is not None:
            # fail closed: report on the protocol and end the process; the module cannot catch or undo this
            try:
                _write(proto_fd, (_dumps({"ok": False, "violation": reason}) + "\n").encode())
            finally:
                _exit(VIOLATION_EXIT)

    return hook


def _preload_world(spec):
    """The module's target world, built and warmed before the hook with its packages importable for the
    preload only (see `trace_cli.envs.worlds.preload`); the paths it reads at run time (read roots)."""
    if not spec:
        return ()
    from trace_cli.envs.worlds.preload import preload

    before = frozenset(sys.modules)
    reads = tuple(preload(str(spec["world"]), tuple(str(s) for s in spec["sites"])))
    # what the world's code newly imported but a module may not import itself leaves sys.modules: the world
    # keeps its references, and the module's own import is refused as without a world
    for name in [m for m in sys.modules if m not in before and _refused_import(m)]:
        del sys.modules[name]
    return reads


def _refused_import(name):
    """Whether the hook refuses `import name` (the same tests as its "import" event)."""
    top = name.split(".")[0]
    return name in _NET or top in _NET or name == "urllib.request" or top in _PROC or top in _SUBINTERP


def _read_roots(workdir, module_path, pkg_dir, pkg_root, world_reads=()):
    real, absolute = os.path.realpath, os.path.abspath
    allowed = [
        workdir,
        module_path,
        pkg_dir,
        *world_reads,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
    ]
    allowed += [p for p in sys.path if p and os.path.isdir(p) and real(p) != real(pkg_root)]
    # the hook compares normalised (not resolved) paths, so each is given as the module sees it and real
    return frozenset(
        {"/dev/null", "/dev/urandom"} | {real(p) for p in allowed} | {absolute(p) for p in allowed}
    )


def _dispatcher(code, module_path):
    """dispatch(req) -> the plain result of one request; the module is executed on the first `new`."""
    import dataclasses
    import types

    envs, loaded = {}, []

    def plain(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.asdict(x)
        return x

    def load():
        if not loaded:
            mod = types.ModuleType("sandboxed_env_module")
            mod.__file__ = module_path
            sys.modules[mod.__name__] = mod
            exec(code, mod.__dict__)  # noqa: S102 - this is the point: the module runs here, inside the sandbox
            loaded.append(mod)
        return loaded[0]

    def new(params):
        mod = load()
        make = getattr(mod, "make_env", None) or getattr(mod, "Env", None)
        if make is None:
            raise AttributeError("the module defines neither make_env(**params) nor a class Env")
        env = make(**(params or {}))
        h = len(envs) + 1
        while h in envs:
            h += 1
        envs[h] = env
        return {
            "handle": h,
            "name": str(getattr(env, "name", "module")),
            "max_turns": int(getattr(env, "max_turns", 12)),
        }

    calls = {
        "reset": lambda env, req: plain(env.reset(int(req["seed"]))),
        "step": lambda env, req: plain(env.step(req["action"])),
        "verify": lambda env, req: plain(env.verify()),
        "task_metadata": lambda env, req: plain(env.task_metadata()),
        "reference_actions": lambda env, req: [plain(a) for a in env.reference_actions()],
    }

    def dispatch(req):
        op = req["op"]
        if op == "ping":
            return "pong"
        if op == "new":
            return new(req.get("params"))
        env = envs[req["handle"]]
        if op == "del":
            envs.pop(req["handle"], None)
            return None
        if op not in calls:
            raise ValueError(f"unknown op {op!r}")
        return calls[op](env, req)

    return dispatch


def _signal_state():
    """What a call may not leave behind, all immutable: (C functions of `_signal` bound now, (signal, handler
    before the module ran, name) for each signal, (timer, name) for each interval timer). The module can
    rebind `signal.*` and what the `signal` wrappers use, and reach this tuple through frames; not change it."""
    import _signal
    import signal

    known = signal.Signals._value2member_map_
    handlers = tuple(
        (s, _signal.getsignal(s), known[s].name if s in known else str(s))
        for s in sorted(_signal.valid_signals())
    )
    timers = tuple((getattr(_signal, t), t) for t in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF"))
    return (_signal.getsignal, _signal.signal, _signal.getitimer, _signal.setitimer), handlers, timers


def _left_behind(state):
    """Undo every signal handler and interval timer the call left behind (so none can run module code between
    calls) and name the first; None when there was none. Only its arguments are used: no globals, no closure."""
    (getsignal, set_handler, getitimer, setitimer), handlers, timers = state
    found = None
    for sig, handler, name in handlers:
        if getsignal(sig) is not handler:
            set_handler(sig, handler)
            found = found or f"a handler for {name}"
    for which, name in timers:
        if getitimer(which) != (0.0, 0.0):
            setitimer(which, 0.0)
            found = found or f"an interval timer ({name})"
    return found


_STDLIB = frozenset(sys.stdlib_module_names)


def _reply(dispatch, req, traceback_text):
    try:
        return {"ok": True, "result": dispatch(req)}
    except MemoryError:
        return {"ok": False, "etype": "MemoryError", "error": "memory limit exceeded"}
    except BaseException as e:  # noqa: BLE001 - every error of the module goes back to the parent
        error = str(e)[:500]
        name = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
        if type(name) is str and name.partition(".")[0] in _STDLIB:
            # masked by the jail (a native module it does not mount), not a broken Python installation
            error = (
                f"the sandbox does not offer the standard-library module {name!r} (a sandboxed module may use "
                "the pure-Python standard library and trace_cli.envs only)"
            )
        reply = {
            "ok": False,
            "etype": type(e).__name__,
            "error": error,
            "trace": traceback_text()[-3000:],
        }
        if isinstance(e, OSError) and isinstance(e.errno, int):
            reply["errno"] = e.errno
        return reply


def main():
    workdir, module_path, cfg, pkg_root = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    world = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None  # {"world", "sites"} or null
    sys.path.insert(0, pkg_root)
    os.chdir(workdir)
    _limits(cfg)
    proto_fd = os.dup(1)
    os.dup2(2, 1)  # the module's prints go to stderr, never into the protocol
    requests, loads, dumps, write, answer_bytes = (
        sys.stdin,
        json.loads,
        json.dumps,
        os.write,
        cfg["answer_bytes"],
    )
    with open(module_path, encoding="utf-8") as f:  # read and compiled before the hook, run after it
        code = compile(f.read(), module_path, "exec")
    pkg_dir = _trusted_imports()
    world_reads = _preload_world(
        world
    )  # sys.path is as before again: the read roots never hold site-packages
    read_roots = _read_roots(workdir, module_path, pkg_dir, pkg_root, world_reads)
    # no bytecode cache at all: later imports compile from source and never look for a .pyc (marshal.loads
    # is refused, and a cache path outside the read roots would be a false alarm on every stdlib import)
    sys.implementation.cache_tag = None
    sys.pycache_prefix = None
    dispatch, state, reply_of = _dispatcher(code, module_path), _signal_state(), _reply
    left_behind, trace_text = _left_behind, traceback.format_exc
    workdirs = (os.path.abspath(workdir), os.path.realpath(workdir))
    sys.addaudithook(_make_hook(proto_fd, workdirs, read_roots))
    # no call id (the module could read it here): answers carry the count of requests read, and the parent
    # sends one request at a time and freezes this process between calls (see `protocol.py`)
    n = 0
    for line in requests:
        n += 1
        reply = reply_of(dispatch, loads(line), trace_text)
        reply["n"] = n
        left = left_behind(state)
        if left:
            reply = {
                "ok": False,
                "violation": f"the module left {left} installed; a sandboxed module may not run between calls",
            }
        try:
            text = dumps(reply, default=str)
        except BaseException as e:  # noqa: BLE001
            text = dumps(
                {"ok": False, "n": n, "etype": type(e).__name__, "error": f"unserialisable result: {e}"}
            )
        if len(text) > answer_bytes:  # ASCII JSON: characters are bytes; the parent refuses it all the same
            text = dumps({"ok": False, "n": n, "too_large": len(text)})
        data = memoryview((text + "\n").encode())  # slices of a view copy nothing: linear in the answer
        while data:
            data = data[write(proto_fd, data) :]


if __name__ == "__main__":
    main()
