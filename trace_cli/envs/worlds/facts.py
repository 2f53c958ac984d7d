"""Helpers every world's episodes share: `clone` (a fast deep copy of JSON-like data) and `fact_communicated`
(whether a fact, a number by value or a word on word boundaries, appears in the agent's messages)."""

from __future__ import annotations

import copy
import re
from typing import Any


def clone(data: Any) -> Any:
    """Deep copy of JSON-like data (dicts, lists, tuples of scalars), ~3x faster than copy.deepcopy, which
    dominated reset(); anything else goes through deepcopy. No marshal: a sandboxed module that subclasses
    these environments sets their state, and unmarshalling it in trusted code would load crafted bytecode."""
    t = type(data)
    if t is dict:
        return {k: clone(v) for k, v in data.items()}
    if t is list:
        return [clone(v) for v in data]
    if t in _SCALARS:
        return data
    if t is tuple:
        return tuple(clone(v) for v in data)
    return copy.deepcopy(data)


_SCALARS = frozenset({str, int, float, bool, type(None)})


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[float]:
    """Every number in the text, read leniently ("1,234.50", "$60", "60.0" all count)."""
    out: set[float] = set()
    for m in _NUMBER.findall(text):
        for candidate in [m.replace(",", ""), *m.split(",")]:
            try:
                out.add(round(float(candidate), 2))
            except ValueError:
                pass
    return out


def fact_communicated(fact: str, messages: list[str]) -> bool:
    """Numbers match by value (60 == 60.00); words match case-insensitively on word boundaries."""
    try:
        value = round(float(fact), 2)
    except ValueError:
        pattern = re.compile(rf"(?<!\w){re.escape(fact)}(?!\w)", re.I)
        return any(pattern.search(m) for m in messages)
    return any(value in _numbers(m) for m in messages)
