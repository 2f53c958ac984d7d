"""Sandbox round 4 (issue 35): no false alarm on the standard library, no way around the in-process guard
among those found, bounded inodes and answers, nothing of the module running between calls, the four new
seccomp refusals."""

from __future__ import annotations

import errno
import importlib.util
import marshal
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from trace_testing import run_trace

import trace_cli.envs.sandbox.protocol as protocol
from trace_cli.envs.sandbox import Limits, SandboxError, SandboxViolation, SandboxWorker, check_module, jail

pytestmark = pytest.mark.needs_sandbox

FAST = Limits(cpu_s=2.0, timeout_s=20.0, memory_mb=512)
TEMPLATE = "from trace_cli.envs.synthetic import TEMPLATES\n"
MAKE = "\ndef make_env(**params):\n{body}\n    return TEMPLATES['precondition_verification'](**params)\n"


def _module(body: str = "", head: str = "") -> str:
    return TEMPLATE + head + MAKE.format(body=textwrap.indent(textwrap.dedent(body), "    "))


def _quick_check(src: str):
    return check_module(
        src, {}, FAST, reference_seeds=5, determinism_seeds=1, do_nothing_seeds=1, leakage_seeds=1
    )


# ----------------------------------------------------------------------------------------------- item 1
STDLIB = (
    "heapq statistics decimal fractions uuid numbers difflib pprint signal pickle bisect array enum json "
    "textwrap datetime calendar operator contextlib abc types weakref struct base64 binascii zlib bz2 lzma "
    "csv io string unicodedata secrets time queue graphlib html html.parser ipaddress shlex fnmatch locale "
    "gettext zoneinfo dataclasses typing collections.abc copy math cmath random re itertools functools "
    "hashlib hmac reprlib keyword tokenize ast warnings logging traceback linecache argparse tomllib "
    "colorsys xml.etree.ElementTree email.message urllib.parse codecs encodings.idna pathlib tempfile "
    "glob shutil fileinput operator sched threading"
).split()


def test_a_module_importing_the_pure_python_standard_library_is_accepted():
    """No false alarm: every import runs after the audit hook, through the real worker, in the jail."""
    src = _module(body="\n".join(f"__import__({m!r})" for m in STDLIB))
    v = _quick_check(src)
    assert v.accepted, v.reason
    sorter = _module(head="import heapq, statistics\n", body="assert heapq.nsmallest(2, [3, 1, 2]) == [1, 2]")
    assert _quick_check(sorter).accepted


# ----------------------------------------------------------------------------------------------- item 2
SUBINTERP = (
    r"blocked: (module \S+ is not allowed \(sub-interpreters|starting a sub-interpreter is not allowed)"
)


@pytest.mark.parametrize(
    "body, why",
    [
        ("import _xxsubinterpreters as x\nx.run_string(x.create(), 'import os; os.chdir(\"/\")')", SUBINTERP),
        ("import _testcapi\n_testcapi.run_in_subinterp('import os')", SUBINTERP),
        (  # no import statement, so no import event: the masked file does not load (or the hook stops it)
            "import importlib.machinery as m\n"
            f"p = {importlib.util.find_spec('_xxsubinterpreters').origin!r}\n"
            "spec = m.ModuleSpec('_xxsubinterpreters', None, origin=p)\n"
            "m.ExtensionFileLoader('_xxsubinterpreters', p).create_module(spec).create()",
            SUBINTERP + r"|the module raised ImportError in new\(\)",
        ),
    ],
    ids=["_xxsubinterpreters", "_testcapi", "module_from_spec"],
)
def test_sub_interpreters_are_refused(body, why):
    v = _quick_check(_module(body=body))
    assert not v.accepted and re.match(why, v.reason), v.reason


def test_relative_paths_are_checked_against_the_real_working_directory(tmp_path):
    """Whatever moved the working directory out of the sandbox directory, `etc/hostname` is then read
    outside it: the audit hook resolves relative paths against the real working directory."""
    work = tmp_path / "work"
    work.mkdir()
    prog = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(jail.__file__)!r})
        import child
        hook = child._make_hook(1, ({str(work)!r},), frozenset({{{str(work)!r}}}))
        os.chdir('/')
        sys.addaudithook(hook)
        open('etc/hostname').read()
    """)
    r = subprocess.run([sys.executable, "-I", "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == protocol.VIOLATION_EXIT, r.stderr
    assert "reading outside the sandbox is not allowed (etc/hostname)" in r.stdout


def test_trusted_code_never_unmarshals(monkeypatch):
    """The envs copy their state without marshal: a module that sets `_initial` to marshalled code gets
    bytes back, never a code object built from them."""
    from trace_cli.envs import shop
    from trace_cli.envs.synthetic import TEMPLATES

    calls = []
    monkeypatch.setattr(marshal, "loads", lambda *a: calls.append(a))
    env = TEMPLATES["precondition_verification"]()
    env.reset(0)
    env.step(env.reference_actions()[0])
    shop.ShopEnv().reset(1)
    assert calls == []
    env._initial = marshal.dumps(compile("1", "x", "eval"))
    with pytest.raises(TypeError, match="'bytes' object is not a mapping"):  # not a code object
        env._start_episode()


def test_only_allowed_extension_modules_load_anywhere_in_the_jail(run_in_jail):
    """Every file on the jail's view named as an extension module (any Python's, anywhere under /usr or the
    interpreter's prefix: a `_cffi_backend` under /usr/lib too) is empty, but the allowed standard ones."""
    roots = sorted({os.path.realpath(d) for d in jail._ro_dirs()})
    probe = textwrap.dedent(f"""
        import importlib.machinery, os, re
        pat = re.compile({jail._EXTENSION_NAME.pattern!r})
        out = {{}}
        for root in {roots!r}:
            for d, dirs, files in os.walk(root):
                for f in files:
                    p = os.path.join(d, f)
                    if not (pat.search(f) or (f.endswith('.so') and '/python' in d)) or os.path.islink(p):
                        continue
                    name = f.split('.')[0]
                    try:
                        importlib.machinery.ExtensionFileLoader(name, p).create_module(
                            importlib.machinery.ModuleSpec(name, None, origin=p))
                        out[p] = name
                    except BaseException:
                        pass
        print(repr(out))
    """)
    loaded = run_in_jail(probe)
    assert loaded, "not even the allowed extensions loaded"
    assert {p: n for p, n in loaded.items() if n not in jail.SAFE_EXTENSIONS} == {}


def test_no_native_code_loads_from_the_work_directory(run_in_jail):
    """The one writable place is mounted noexec: a copy of an extension module written there does not load."""
    origin = importlib.util.find_spec("_json").origin
    probe = textwrap.dedent(f"""
        import importlib.machinery as m, shutil
        shutil.copy({origin!r}, '_json.so')
        try:
            m.ExtensionFileLoader('_json', '_json.so').create_module(m.ModuleSpec('_json', None, origin='_json.so'))
            print(repr({{'loaded': True}}))
        except ImportError as e:
            print(repr({{'loaded': False, 'error': str(e)}}))
    """)
    out = run_in_jail(probe)
    assert out == {"loaded": False, "error": "./_json.so: failed to map segment from shared object"}


# ----------------------------------------------------------------------------------------------- item 3
def test_the_work_directory_has_a_bounded_number_of_inodes(run_in_jail):
    probe = textwrap.dedent("""
        n, err = 0, None
        try:
            for n in range(20000):
                open(f'f{n}', 'w').close()
        except OSError as e:
            err = e.errno
        print(repr({'n': n, 'errno': err}))
    """)
    out = run_in_jail(probe)
    assert out["errno"] == errno.ENOSPC and out["n"] <= jail.WORK_INODES, out


BIG = """
    env = TEMPLATES['precondition_verification'](**params)
    env.task_metadata = lambda: {'answer_values': ['x' * (6 << 20)]}
    return env
"""
UNENDING = """
    for fd in range(3, 12):
        try:
            os.write(fd, b'{"ok": true, "result": "' + b'x' * (6 << 20))
        except OSError:
            pass
"""
DEEP_RAW = """
    for fd in range(3, 12):
        try:
            os.write(fd, b'[' * 200000 + b'\\n')
        except OSError:
            pass
"""
DEEP = """
    env = TEMPLATES['precondition_verification'](**params)
    deep = []
    for _ in range(100):
        deep = [deep]
    env.task_metadata = lambda: {'answer_values': deep}
    return env
"""


def _whole_make_env(body: str) -> str:
    """A module whose make_env is `body` (which returns the environment itself)."""
    return (
        "import os\n"
        + TEMPLATE
        + "\ndef make_env(**params):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


@pytest.mark.parametrize(
    "body, op, why",
    [
        (BIG, "task_metadata", r"the answer is larger than 4 MB \(in task_metadata\(\)\)"),
        (UNENDING, "new", r"the answer is larger than 4 MB \(in new\(\)\)"),
        (DEEP_RAW, "new", r"nested deeper than 64 levels \(in new\(\)\)"),
        (DEEP, "task_metadata", r"nested deeper than 64 levels \(in task_metadata\(\)\)"),
    ],
    ids=["6 MB answer", "6 MB without a newline", "200,000 levels", "100 levels"],
)
def test_answers_are_bounded_in_size_and_depth(body, op, why):
    with SandboxWorker(_whole_make_env(body), FAST) as w:
        with pytest.raises(SandboxViolation, match=why):
            handle = w.call("new", params={})["handle"]
            w.call(op, handle=handle)
        assert w.proc.poll() is not None


def test_an_answer_too_deep_to_serialise_is_the_modules_error_and_the_worker_goes_on():
    body = DEEP.replace("range(100)", "range(5000)")
    with SandboxWorker(_whole_make_env(body), FAST) as w:
        handle = w.call("new", params={})["handle"]
        with pytest.raises(
            SandboxError, match="raised RecursionError in task_metadata.*unserialisable result"
        ):
            w.call("task_metadata", handle=handle)
        assert w.call("ping") == "pong"


DEEP_RESET = """from trace_cli.envs.synthetic import TEMPLATES

def make_env(**params):
    env = TEMPLATES["precondition_verification"](**params)
    real = env.reset
    def reset(seed):
        obs = real(seed)
        deep = []
        for _ in range(200):
            deep = [deep]
        obs.info["deep"] = deep
        return obs
    env.reset = reset
    return env
"""


def test_trace_eval_on_a_deeply_nested_answer_fails_cleanly(module_env_store):
    store = module_env_store("deep", DEEP_RESET)
    r = run_trace(
        "eval", "--env", "store://environment/deep", "--model", "policy:reference", "--store", store
    )
    assert r.returncode == 1, r.stderr
    assert "the answer is nested deeper than 64 levels (in reset())" in r.stderr
    assert "internal error" not in r.stderr and "RecursionError" not in r.stderr


# ----------------------------------------------------------------------------------------------- item 4
FORGE_AND_RUN_ON = """
    import json, os, sys, time
    f, ids = sys._getframe(), []
    while f is not None:
        ids.append(f.f_locals.get('call_id'))
        f = f.f_back
    forged = {'ok': True, 'id': next((i for i in ids if i), None), 'n': 2,
              'result': {'handle': 7, 'name': 'forged', 'max_turns': 1}}
    for fd in range(3, 12):
        try:
            os.write(fd, (json.dumps(forged) + '\\n').encode())
        except OSError:
            pass
    end = time.process_time() + 3
    while time.process_time() < end:
        pass
"""


def test_nothing_of_the_module_runs_between_calls_and_a_late_answer_is_caught():
    """The module forges the answer to new() (with the call id, where its frames hold one) and computes on:
    the parent freezes it as soon as it has an answer, so it burns no CPU between calls, and the loop's own
    late answer is found out at the next call."""
    with SandboxWorker(_module(body=FORGE_AND_RUN_ON), FAST) as w:
        w.call("new", params={})
        cpu0 = protocol.tree_cpu(w.proc.pid)
        time.sleep(1.5)
        assert protocol.tree_cpu(w.proc.pid) - cpu0 < 0.3
        with pytest.raises(SandboxViolation, match="does not belong to ping|between calls"):
            w.call("ping")


ALARM = """
    import signal
    signal.signal(signal.SIGALRM, lambda *a: sum(range(10**6)))
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
"""
TIMER_ONLY = """
    import signal
    signal.setitimer(signal.ITIMER_VIRTUAL, 5.0)
"""


@pytest.mark.parametrize(
    "body, what",
    [(ALARM, "a handler for SIGALRM"), (TIMER_ONLY, r"an interval timer \(ITIMER_VIRTUAL\)")],
    ids=["SIGALRM handler", "itimer"],
)
def test_signal_handlers_and_timers_may_not_survive_a_call(body, what):
    with SandboxWorker(_module(body=body), FAST) as w:
        with pytest.raises(SandboxViolation, match=f"blocked: the module left {what} installed.*in new"):
            w.call("new", params={})
    v = _quick_check(_module(body=body))
    assert not v.accepted and v.reason.startswith("blocked: the module left"), v.reason


def test_a_violation_between_calls_is_named_as_such():
    body = """
        import threading, time
        threading.Thread(target=lambda: (time.sleep(0.1), open('/etc/hostname'))).start()
    """
    with SandboxWorker(_module(body=body), FAST) as w:
        w.call("new", params={})
        with pytest.raises(SandboxViolation) as e:
            w.call("ping")
    assert e.value.reason.startswith("blocked: reading outside the sandbox is not allowed (/etc/hostname)")
    assert "between calls (after new(), before ping())" in e.value.reason
    assert "exit code" not in e.value.reason
