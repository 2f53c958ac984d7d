"""Read YAML/JSON documents with clear errors, and apply `--set a.b[0].c=value` overrides."""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from trace_cli.config import safe_yaml
from trace_cli.errors import InputError, NotFoundError, UsageError, json_error


def _yaml_load(text: str) -> Any:
    """Safe types only; duplicate keys, alias bombs, deep nesting and huge documents are errors."""
    return safe_yaml.load(text)


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_input_file(path: str | Path, *, expected: str, allow_dir: bool = False) -> os.stat_result:
    """Stat an input path and refuse (exit 2, naming the path and the way out) what is not a readable regular
    file: a missing path, a dangling link and a symlink loop each named as such, and a FIFO, socket or device,
    which would block or never end if read. Directories pass only with `allow_dir`."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(
                f"{p}: symbolic link loop (too many levels of symbolic links); expected {expected}",
                hint="point the link at a real file, or pass the file's own path",
            ) from e
        if e.errno == errno.ENOENT and p.is_symlink():
            raise NotFoundError(
                f"{p}: dangling symbolic link (its target {os.readlink(p)} does not exist); expected {expected}"
            ) from e
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NotFoundError(f"{p}: no such file") from e
        raise InputError(f"{p}: cannot read ({e.strerror}); expected {expected}") from e
    if stat.S_ISDIR(st.st_mode):
        if allow_dir:
            return st
        raise InputError(f"{p}: is a directory, expected {expected}")
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in _SPECIAL if test(st.st_mode)), "not a regular file")
        raise InputError(
            f"{p}: is {what}, not a regular file; expected {expected}",
            hint="save the data to a file first and pass that file",
        )
    return st


def load_document(path: str | Path) -> Any:
    """Load one YAML or JSON file; syntax errors name the file, line and column."""
    p = Path(path)
    size = check_input_file(p, expected="a YAML or JSON file").st_size
    if p.suffix.lower() in _DATA_SUFFIXES:
        raise InputError(
            f"{p}: a JSON Lines data file, not a YAML or JSON config or recipe", hint=_JSONL_HINT
        )
    if size > safe_yaml.MAX_DOCUMENT_BYTES:
        raise InputError(
            f"{p}: {size:,} bytes; config and recipe files are limited to "
            f"{safe_yaml.MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB",
            hint="keep data such as episodes and tasks in their own files, named by path in the recipe: "
            "`with: {format: jsonl, path: episodes.jsonl}`",
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{p}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected YAML or JSON"
        ) from e
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from e
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return _yaml_load(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    except ValueError as e:  # a number too long to convert
        raise InputError(f"{p}: invalid JSON: {json_error(e)}") from None
    except RecursionError as e:
        raise InputError(f"{p}: nested too deeply to read; flatten the document") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(
            f"{where}: invalid YAML: {problem}", hint=_JSONL_HINT if looks_like_jsonl(text) else ""
        ) from e


_DATA_SUFFIXES = (".jsonl", ".ndjson")
_JSONL_HINT = (
    "JSON Lines episodes, one JSON object per line, are data: ingest them with `trace ingest jsonl FILE` "
    "or name the file in a recipe's ingest step; `trace run` and `trace validate` take a YAML recipe"
)


def looks_like_jsonl(text: str) -> bool:
    """True when the first two non-empty lines are each a JSON object (what a JSONL file holds)."""
    lines = [ln for ln in text.split("\n", 64)[:64] if ln.strip()][:2]
    if len(lines) < 2:
        return False
    for ln in lines:
        try:
            if not isinstance(json.loads(ln), dict):
                return False
        except ValueError:
            return False
    return True


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


def set_path(doc: Any, parts: list[str | int], value: Any, *, label: str) -> Any:
    """Set `doc[parts[0]][parts[1]]...` to `value` in place, creating missing mappings (or lists before an
    index); return the value it replaces (None if none). `label` names the setting in errors."""
    node = doc
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise UsageError(f"{label}: index [{part}] does not exist")
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise UsageError(f"{label}: {part!r} is not inside a mapping")
        if part not in node or node[part] is None:
            node[part] = [] if isinstance(nxt, int) else {}
        node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise UsageError(f"{label}: index [{last}] does not exist")
        old = node[last]
    else:
        if not isinstance(node, dict):
            raise UsageError(f"{label}: {last!r} is not inside a mapping")
        old = node.get(last)
    node[last] = value
    return old


def apply_overrides(doc: Any, overrides: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """Return a copy of `doc` with every override applied, plus a record of what changed."""
    out = copy.deepcopy(doc) if doc is not None else {}
    applied: list[dict[str, Any]] = []
    for text in overrides:
        parts, value = parse_override(text)
        old = set_path(out, parts, value, label=f"--set {text!r}")
        applied.append({"key": text.split("=", 1)[0].strip(), "old": old, "new": value})
    return out, applied


def load_artifact_yaml(path: str | Path) -> Any:
    """A YAML file inside an artifact (capabilities.yaml, environment.yaml) through the hardened loader; a
    damaged or hand-edited one is exit 2 naming the file and the way out, never a traceback."""
    p = Path(path)
    fix = (
        "the artifact is damaged: restore it, or delete it and rerun the step that made it; "
        "`trace store verify` lists every damaged artifact"
    )
    try:
        return safe_yaml.load(p.read_bytes())
    except FileNotFoundError as e:
        raise InputError(f"{p}: missing from its artifact", hint=fix) from e
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})", hint=fix) from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{where}: invalid YAML: {problem}", hint=fix) from e
