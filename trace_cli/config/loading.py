"""Read YAML/JSON documents with clear errors, and apply `--set a.b[0].c=value` overrides."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from trace_cli.config import safe_yaml
from trace_cli.errors import InputError, NotFoundError, UsageError


def _yaml_load(text: str) -> Any:
    """Safe types only; duplicate keys, alias bombs, deep nesting and huge documents are errors."""
    return safe_yaml.load(text)


def load_document(path: str | Path) -> Any:
    """Load one YAML or JSON file; syntax errors name the file, line and column."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a YAML or JSON file")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file, expected a YAML or JSON file")
    size = p.stat().st_size
    if size > safe_yaml.MAX_BYTES:
        raise InputError(
            f"{p}: {size:,} bytes; config and recipe files are limited to "
            f"{safe_yaml.MAX_BYTES // (1024 * 1024)} MiB"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{p}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected YAML or JSON"
        ) from e
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return _yaml_load(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    except RecursionError as e:
        raise InputError(f"{p}: nested too deeply to read; flatten the document") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"{where}: invalid YAML: {problem}") from e


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    pos = 0
    for m in _SEGMENT.finditer(path):
        gap = path[pos : m.start()]
        if gap not in ("", "."):
            raise UsageError(f"--set {path!r}: cannot parse the key path near {gap!r}")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if not parts or pos != len(path):
        raise UsageError(f"--set {path!r}: cannot parse the key path")
    return parts


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """`a.b[1].c=16` -> (["a", "b", 1, "c"], 16); the value is parsed as YAML (so `true`, `1e-5`, `[1,2]` work)."""
    if "=" not in text:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE, e.g. --set steps.train.with.lora.rank=16")
    key, raw = text.split("=", 1)
    try:
        value = _yaml_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return _split_path(key.strip()), value


def apply_overrides(doc: Any, overrides: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """Return a copy of `doc` with every override applied, plus a record of what changed."""
    out = copy.deepcopy(doc) if doc is not None else {}
    applied: list[dict[str, Any]] = []
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    raise UsageError(f"--set {text!r}: index [{part}] does not exist")
                node = node[part]
                continue
            if not isinstance(node, dict):
                raise UsageError(f"--set {text!r}: {part!r} is not inside a mapping")
            if part not in node or node[part] is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
        last = parts[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise UsageError(f"--set {text!r}: index [{last}] does not exist")
            old = node[last]
            node[last] = value
        else:
            if not isinstance(node, dict):
                raise UsageError(f"--set {text!r}: {last!r} is not inside a mapping")
            old = node.get(last)
            node[last] = value
        applied.append({"key": text.split("=", 1)[0].strip(), "old": old, "new": value})
    return out, applied
