"""JSON decoding and encoding for the readers (`formats.tau2_read`, `formats.jsonl`), and their bad-record type.

orjson is several times faster than `json` but not a drop-in: it rejects what `json` accepts beyond RFC 8259
(NaN/Infinity, lone surrogates, nesting deeper than 1024, numbers that overflow a double) and, silently, turns
an integer outside [-2**63, 2**64) into a float. So a document (τ²) or line (JSONL) orjson rejects is parsed
with `json` instead, and one parsed with orjson is redone with `json` (`Inexact`) when anything it stores or
reports could show such a rounded integer: a float >= 1e18 in its encoded output, a float where an integer id
belongs, a bad record. Records done with `json` are also encoded with `json` (orjson writes NaN as null).
Otherwise both parsers give the same values, so the stored data and the messages do not depend on the parser;
only the stored JSON text is compact (`{"a":1}` rather than `{"a": 1}`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from trace_cli.errors import InputError, json_error

# One reader's result: the good records as (episode row with its JSON columns encoded, tool-call rows as
# tuples), and the bad ones.
Parsed = tuple[list[tuple[dict, list[tuple]]], list["RecordError"]]

TOO_DEEP = "JSON nested too deeply to read (deeper than ~900 levels of arrays/objects)"
TOO_DEEP_FIX = "no τ²-bench or JSONL episode nests that deep: flatten the value or drop the record"


class RecordError(Exception):
    """One bad record: where it is and every problem with it."""

    def __init__(self, where: str, problems: list[str], raw: Any = None, excluded: bool = False):
        super().__init__(f"{where}: " + "; ".join(problems))
        self.where = where
        self.problems = problems
        self.raw = raw
        # a valid run that τ²-bench itself leaves out of its metrics (infrastructure error, no reward):
        # never fails the file, always listed in rejects.jsonl
        self.excluded = excluded


class Inexact(Exception):
    """orjson may have changed a value (an integer beyond 64 bits, NaN): redo this record with `json`."""


NOT_PARSED = object()
# a float >= 1e18 as orjson writes it (1.2345678901234568e+22): the only trace a rounded integer leaves
_BIG_FLOAT = re.compile(rb"[0-9]e\+(?:1[89]|[2-9][0-9]|[0-9]{3})")


def type_name(v: Any) -> str:
    """The JSON name of a value's type, for messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _fast_dumps(v: Any) -> bytes:
    """orjson-encode a value parsed by orjson (UTF-8 bytes, which Arrow takes as a string as they are)."""
    try:
        out = orjson.dumps(v)
    except TypeError as e:  # an int beyond 64 bits, a lone surrogate, nesting deeper than 254: `json` does it
        raise Inexact from e
    if b"e+" in out and _BIG_FLOAT.search(out):
        raise Inexact
    return bytes(memoryview(out))  # see _dumps_trimmed


def _dumps_trimmed(v: Any) -> bytes:
    """orjson.dumps, copied to a buffer of its size: orjson's own is rounded up to a power of two, at least
    4 KiB, which for a million small tool-call arguments held until the table is built is gigabytes."""
    return bytes(memoryview(orjson.dumps(v)))


def _std_dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def _fast_enc(v: Any) -> bytes | None:
    return None if v is None else _fast_dumps(v)


def _std_enc(v: Any) -> str | None:
    return None if v is None else json.dumps(v, ensure_ascii=False)


def encoders(fast: bool) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(enc, dumps) for a record parsed by orjson (`fast`) or by `json`: `enc` encodes a JSON column (None stays
    None) and checks that orjson changed nothing (`Inexact`); `dumps` encodes parts of values `enc` has
    checked already (the tool-call rows of its messages), so it checks nothing."""
    return (_fast_enc, _dumps_trimmed) if fast else (_std_enc, _std_dumps)


def check_raw(raw: Any) -> None:
    """A bad record parsed by orjson: its messages and reject line must not show a rounded integer."""
    _fast_dumps(raw)


def decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected JSON") from e


def json_document(data: bytes, path: Path, what: str, hint: str | None = None) -> Any:
    """One JSON document parsed with `json` (exact values and its error positions), or an InputError."""
    text = decode(data, path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty; expected {what}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); is the file truncated?", hint=hint
        ) from e
    except ValueError as e:  # a number too long to convert
        raise InputError(f"{path}: not valid JSON here ({json_error(e)})", hint=hint) from None
    except RecursionError as e:
        raise InputError(f"{path}: {TOO_DEEP}", hint=TOO_DEEP_FIX) from e
