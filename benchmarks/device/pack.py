#!/usr/bin/env python
"""Split a large file into parts of at most N MiB with a manifest (size, sha256 of the whole and of each part),
and join them back, checking every digest: how a file larger than a call's 64 MiB working tree (the 98 MB
SmolLM2 GGUF) travels to a device machine across calls.

    python benchmarks/device/pack.py split FILE DIR [--part-mib 48]   # DIR/NAME.partNN + DIR/NAME.pack.json
    python benchmarks/device/pack.py join DIR/NAME.pack.json OUT      # verified; exit 1 on a missing/bad part
    python benchmarks/device/pack.py check DIR/NAME.pack.json         # which parts are present and intact

A join may also read parts from several folders (`--from DIR` repeated), as parts carried by successive calls
land where each call left them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split(src: Path, dest: Path, part_mib: float = 48) -> Path:
    """Write `src` as parts of at most `part_mib` MiB under `dest`, and the manifest; returns the manifest."""
    size = int(part_mib * (1 << 20))
    if size <= 0:
        raise ValueError("part size must be positive")
    dest.mkdir(parents=True, exist_ok=True)
    parts, whole = [], hashlib.sha256()
    with src.open("rb") as f:
        while data := f.read(size):
            whole.update(data)
            name = f"{src.name}.part{len(parts):02d}"
            (dest / name).write_bytes(data)
            parts.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    doc = {"name": src.name, "bytes": src.stat().st_size, "sha256": whole.hexdigest(), "parts": parts}
    manifest = dest / f"{src.name}.pack.json"
    manifest.write_text(json.dumps(doc, indent=2) + "\n")
    return manifest


def _find(name: str, where: list[Path]) -> Path | None:
    return next((d / name for d in where if (d / name).is_file()), None)


def check(manifest: Path, where: list[Path] | None = None) -> list[str]:
    """Problems with the parts (missing, wrong size or digest); empty when all are present and intact."""
    doc = json.loads(manifest.read_text())
    where = where or [manifest.parent]
    problems = []
    for p in doc["parts"]:
        path = _find(p["name"], where)
        if path is None:
            problems.append(f"{p['name']}: missing")
        elif path.stat().st_size != p["bytes"] or _sha256(path) != p["sha256"]:
            problems.append(f"{p['name']}: size or sha256 differs from the manifest")
    return problems


def join(manifest: Path, out: Path, where: list[Path] | None = None) -> Path:
    """Rejoin the parts into `out`, checking each part's and the whole file's digest (ValueError if any
    differs; `out` is then not left behind)."""
    doc = json.loads(manifest.read_text())
    problems = check(manifest, where)
    if problems:
        raise ValueError("; ".join(problems))
    where = where or [manifest.parent]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    whole = hashlib.sha256()
    with tmp.open("wb") as f:
        for p in doc["parts"]:
            data = _find(p["name"], where).read_bytes()  # type: ignore[union-attr]
            whole.update(data)
            f.write(data)
    if whole.hexdigest() != doc["sha256"] or tmp.stat().st_size != doc["bytes"]:
        tmp.unlink()
        raise ValueError(f"{doc['name']}: the joined file's sha256 differs from the manifest")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("dest", type=Path)
    s.add_argument("--part-mib", type=float, default=48)
    for name in ("join", "check"):
        p = sub.add_parser(name)
        p.add_argument("manifest", type=Path)
        if name == "join":
            p.add_argument("out", type=Path)
        p.add_argument("--from", dest="where", type=Path, action="append", help="folder holding parts")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        print(split(a.file, a.dest, a.part_mib))
        return 0
    if a.cmd == "check":
        problems = check(a.manifest, a.where)
        print("\n".join(problems) or "all parts present and intact")
        return 1 if problems else 0
    try:
        print(join(a.manifest, a.out, a.where))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
