#!/usr/bin/env python
"""The transfer plan of a device run, computed from the tree as it is now: a device call carries the working tree
(tracked files and untracked ones git does not ignore) plus the ignored paths it names, 64 MiB in all and 8 paths
at most. The plan packs what must travel (wheels, weight parts made by pack.py) into as few calls as fit beside the
tree, one folder per call, and fails (exit 1) naming the file when something cannot fit: a call that would exceed
the limit never leaves here.

    python benchmarks/device/plan.py --wheels .whl [--parts .w] [--move]   # the calls, their sizes, commands
    python benchmarks/device/plan.py --json                                 # the same as JSON

`--move` puts each call's files into its own folder (.carry0, .carry1, ...: add `/.carry*/` to .git/info/exclude)
so that each call's `carry` is one path. The last call runs the chain (gpu_chain.py): run it first with
`--no-real` (no weights to carry), then with the SmolLM2 profile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
LIMIT = 64 * MIB  # what one call may carry: the working tree and its carried paths together
MAX_CARRY = 8  # paths one call may name
REPO = Path(__file__).resolve().parents[2]


class PlanError(ValueError):
    """Something cannot travel within a call's limit."""


@dataclass
class Call:
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, bytes) carried by this call
    folder: str = ""  # where --move puts them

    @property
    def carry_bytes(self) -> int:
        return sum(b for _, b in self.files)


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of the working tree a call carries: tracked files and untracked ones git does not ignore
    (`shared/` and git's own directory stay behind)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        if name.startswith("shared/"):
            continue
        p = repo / name
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def plan(tree: int, items: list[tuple[str, int]], *, limit: int = LIMIT, headroom: int = MIB) -> list[Call]:
    """The calls that carry `items` ((path, bytes)) beside a tree of `tree` bytes, each call within `limit` less
    `headroom` (files the run adds to the tree: results, bytecode); largest first, first fit. The last call (the
    run) is always there, even with nothing to carry."""
    room = limit - headroom - tree
    if room < 0:
        raise PlanError(
            f"the tree alone is {tree / MIB:.1f} MiB: with {headroom / MIB:.0f} MiB of headroom it exceeds the "
            f"{limit / MIB:.0f} MiB a call carries; move large files out of the tree (or ignore them)"
        )
    calls: list[Call] = []
    for path, size in sorted(items, key=lambda x: -x[1]):
        if size > room:
            raise PlanError(
                f"{path} is {size / MIB:.1f} MiB, more than the {room / MIB:.1f} MiB a call has beside the "
                f"{tree / MIB:.1f} MiB tree: split it (pack.py split FILE DIR --part-mib {max(1, room // MIB)})"
            )
        for c in calls:
            if c.carry_bytes + size <= room:
                c.files.append((path, size))
                break
        else:
            calls.append(Call([(path, size)]))
    if not calls:
        calls.append(Call())
    for i, c in enumerate(calls):
        c.folder = f".carry{i}"
        assert tree + c.carry_bytes + headroom <= limit  # what the plan promises; the test checks it too
    return calls


def items_of(paths: list[Path]) -> list[tuple[str, int]]:
    """(path, bytes) of every file under `paths` (files or folders)."""
    out = []
    for p in paths:
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        out += [(str(f), f.stat().st_size) for f in files]
    return out


def commands(calls: list[Call], *, run: str) -> list[str]:
    """What each call runs: install the wheels it carries, stage the weight parts it carries, and (last) `run`."""
    out = []
    for i, c in enumerate(calls):
        steps = []
        if any(f.endswith(".whl") for f, _ in c.files):
            steps.append(
                f"python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site {c.folder}/*.whl"
            )
        if any(not f.endswith(".whl") for f, _ in c.files):
            steps.append(
                f"mkdir -p /tmp/w && find {c.folder} -type f ! -name '*.whl' -exec cp {{}} /tmp/w/ \\;"
            )
        if i == len(calls) - 1:
            steps.append(run)
        out.append(" && ".join(steps) or "true")
    return out


RUN = "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && python3 benchmarks/device/gpu_chain.py --device cuda"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, action="append", default=[], help="folder of wheels to carry")
    ap.add_argument("--parts", type=Path, action="append", default=[], help="folder of pack.py weight parts")
    ap.add_argument("--move", action="store_true", help="move each call's files into its .carryN folder")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    tree = tree_bytes()
    items = items_of(a.wheels + a.parts)
    real = bool(a.parts)
    try:
        calls = plan(tree, items)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    run = RUN + ("" if real else " --no-real")
    if real:
        run = (
            "python3 benchmarks/device/pack.py join /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf.pack.json "
            f"/tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf && {RUN} --gguf /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    cmds = commands(calls, run=run)
    if a.move:
        for c in calls:
            dest = REPO / c.folder
            dest.mkdir(exist_ok=True)
            for f, _ in c.files:
                shutil.move(f, dest / Path(f).name)
    doc = {
        "limit_mib": LIMIT / MIB,
        "tree_mib": round(tree / MIB, 2),
        "calls": [
            {
                "carry": [c.folder] if c.files else [],
                "carry_mib": round(c.carry_bytes / MIB, 2),
                "total_mib": round((tree + c.carry_bytes) / MIB, 2),
                "files": [f for f, _ in c.files],
                "command": cmd,
            }
            for c, cmd in zip(calls, cmds, strict=True)
        ],
    }
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"tree {doc['tree_mib']} MiB; {len(calls)} call(s), each within {doc['limit_mib']:.0f} MiB:")
        for i, c in enumerate(doc["calls"]):
            print(f"  call {i + 1}: carry {c['carry']} ({c['carry_mib']} MiB, {c['total_mib']} MiB in all)")
            print(f"    {c['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
