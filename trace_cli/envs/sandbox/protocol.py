"""The parent's side of the pipe to a sandboxed child: reading answers within bounds, and the process tree.

The protocol carries no secret call id (anything the child holds, the module can read from its frames). The
parent numbers its calls and sends one request at a time; the child's loop answers with the number of
requests it has read (`n`), and the parent freezes the sandbox's processes (SIGSTOP) as soon as it has its
answer and thaws them (SIGCONT) only to send the next request. So no module code runs between calls, and an
answer the module writes itself can only be written while a call is in flight: it either stands for that call
(as if the module had returned it) or is found out, as a second answer (two lines for one call), as an answer
outside any call (data waiting before a request is sent), or by the loop's own late answer, whose `n` is the
previous call's.

Answers are bounded: at most MAX_ANSWER_BYTES, read in chunks into one buffer with the newline searched in
each new chunk only (linear time), and at most MAX_ANSWER_DEPTH levels of nesting; all answers of an episode
by EPISODE_ANSWER_BYTES, all answers of a worker (a run) by RUN_ANSWER_BYTES.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MAX_ANSWER_BYTES = 4 << 20
# Budgets over many answers (issue 46): what one episode's answers (its reset and every call up to the next
# reset) and a worker's answers over its whole life (one run) may add up to. Every answer is kept by the
# rollout (in the episode's messages) and stored, so these bound the memory and the store a module can fill.
EPISODE_ANSWER_BYTES = 2 * MAX_ANSWER_BYTES  # a real environment's episode: well under 1 MB
RUN_ANSWER_BYTES = 1 << 30
MAX_ANSWER_DEPTH = 64
VIOLATION_EXIT = 86  # the child's exit status after its audit hook reported a violation (see child.py)


class ProtocolError(Exception):
    """The answer breaks the protocol or its bounds; the message says how (the caller adds the call)."""


def _tree(pid: int) -> Iterator[tuple[int, list[Path]]]:
    """(pid, its task directories) for a process and all its descendants, from /proc; gone ones skipped."""
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
            for task in tasks:
                todo += [int(k) for k in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        yield p, tasks


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants; 0 when gone."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for p, _tasks in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            fields_ = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields_[11]) + int(fields_[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return total


def tree_threads(pid: int) -> int:
    """Threads beyond the first of each process in a process tree (0 when gone)."""
    return sum(len(tasks) - 1 for _p, tasks in _tree(pid))


def signal_tree(pid: int, sig: int) -> None:
    """Send `sig` to every process of the tree (SIGSTOP between calls, SIGCONT before the next)."""
    for p, _tasks in _tree(pid):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            continue


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # our own child's session (start_new_session=True)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def cleanup(proc: subprocess.Popen, directory: Path, stderr) -> None:
    """Kill the sandbox, close its pipes and log, remove its directory."""
    kill_group(proc)
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


def signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class Channel:
    """The child's answer pipe: whole lines, each at most MAX_ANSWER_BYTES, read in linear time."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def read_line(self, deadline: float, on_wait: Callable[[], None]) -> bytes | None:
        """The next line (without its newline); None at end of file. `on_wait` runs whenever 0.2 s pass
        without data (it raises to give up); TimeoutError after `deadline` (time.monotonic)."""
        scanned = 0
        while (nl := self.buf.find(b"\n", scanned)) < 0:
            scanned = len(self.buf)
            if scanned > MAX_ANSWER_BYTES:
                raise ProtocolError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MB")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if not ready:
                on_wait()
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        if nl > MAX_ANSWER_BYTES:
            raise ProtocolError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MB")
        line = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        return line

    def pending(self) -> bytes:
        """Whatever the child wrote that nobody asked for yet (read without waiting)."""
        while select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk or len(self.buf) > MAX_ANSWER_BYTES:
                break
            self.buf += chunk
        return bytes(self.buf)


class Unread(Exception):
    """The request could not be written before the call's deadline: the child stopped reading its pipe."""


def send(fd: int, data: bytes, deadline: float, on_wait: Callable[[], None]) -> None:
    """Write all of `data` to the child's request pipe (non-blocking) before `deadline` (time.monotonic);
    Unread when the child has not taken it by then, BrokenPipeError when it is gone. `on_wait` runs whenever
    0.2 s pass without progress (it raises to give up). A module that stops reading its requests (e.g. one
    that swapped the descriptor the loop reads) so never blocks this side for longer than the call may
    take."""
    view = memoryview(data)
    os.set_blocking(fd, False)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unread
        _, ready, _ = select.select([], [fd], [], min(left, 0.2))
        if not ready:
            on_wait()
            continue
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


def decode(line: bytes) -> dict[str, Any]:
    """The answer as a dict; ProtocolError when it is not JSON, not an object or nested too deep."""
    try:
        reply = json.loads(line.decode("utf-8", "replace"))
    except RecursionError:
        raise ProtocolError(f"the answer is nested deeper than {MAX_ANSWER_DEPTH} levels") from None
    except ValueError:
        raise ProtocolError("malformed answer") from None
    if not isinstance(reply, dict):
        raise ProtocolError("malformed answer")
    if _too_deep(reply, MAX_ANSWER_DEPTH):
        raise ProtocolError(f"the answer is nested deeper than {MAX_ANSWER_DEPTH} levels")
    return reply


def _too_deep(obj: Any, limit: int) -> bool:
    todo = [(obj, 1)]
    while todo:
        o, depth = todo.pop()
        if depth > limit:
            return True
        if type(o) is dict:
            todo += [(v, depth + 1) for v in o.values()]
        elif type(o) is list:
            todo += [(v, depth + 1) for v in o]
    return False


def violation_in(data: bytes) -> str | None:
    """The audit hook's report among lines the child wrote, if there is one."""
    for line in data.split(b"\n"):
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(msg, dict) and isinstance(msg.get("violation"), str):
            return msg["violation"]
    return None
