"""Hardened YAML loading: safe types only, duplicate keys rejected, and limits on size, nesting depth and the
size of the document once aliases are expanded (an alias "billion laughs" bomb fails fast instead of
hanging whatever walks the result)."""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

MAX_BYTES = 64 * 1024 * 1024  # manifests and artifact YAML are far smaller
# configs, recipes and candidates files (config.loading.load_document): a 6,000-step recipe is ~0.6 MB, and
# a larger file is refused from its size alone, before seconds of parsing
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 100  # nesting of mappings/sequences
MAX_NODES = 1_000_000  # values with every alias expanded (a 6,000-step recipe has ~100,000)


class YAMLLimitError(yaml.YAMLError):
    """A document over a limit or with a duplicate key; carries a mark like PyYAML's own errors."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark

    def __str__(self) -> str:
        return self.problem


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml parses ~10x faster than pure Python


class SafeLoader(_Base):  # type: ignore[misc,valid-type]
    """SafeLoader (libyaml's when present) that rejects duplicate keys and oversized or deeply nested
    documents, and reads `1e-5` as a number (YAML 1.2; YAML 1.1 wants `1.0e-5` and gives a string)."""

    def get_single_node(self):
        node = super().get_single_node()
        _check_shape(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            # the mapping's own keys, before `<<` merges are flattened in (a key may override a merged one)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue
                if first is not None:
                    raise YAMLLimitError(
                        f"duplicate key {key!r} (first at line {first.line + 1}); each key may appear once",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader, node):
    """YAML's int, or YAMLLimitError naming the line when it is too long to convert (Python refuses integers
    of more than 4300 digits)."""
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:
        raise YAMLLimitError(
            f"an integer longer than {sys.get_int_max_str_digits()} digits", node.start_mark
        ) from None


SafeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
SafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
# ...and every yaml.safe_dump quotes a string of that form (an artifact id such as '748028e155117613'), which
# PyYAML's own resolver would write plain and this loader would read back as a float (inf)
yaml.SafeDumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def _check_shape(root: Node | None) -> None:
    """Before anything is constructed: count nodes as if every alias were expanded (memoised per node, so
    linear in the document's text) and stop at MAX_NODES; reject nesting deeper than MAX_DEPTH and recursive
    aliases. Iterative, so a deep document cannot exhaust the stack here."""
    if root is None:
        return
    size: dict[int, int] = {}
    # iterative post-order walk: (node, children pushed?, depth)
    stack: list[tuple[Node, bool, int]] = [(root, False, 1)]
    on_path: set[int] = set()
    while stack:
        node, expanded, depth = stack.pop()
        nid = id(node)
        if nid in size:
            continue
        if depth > MAX_DEPTH:
            raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels", node.start_mark)
        if isinstance(node, ScalarNode):
            size[nid] = 1
            continue
        kids = [x for kv in node.value for x in kv] if isinstance(node, MappingNode) else list(node.value)
        if not expanded:
            if nid in on_path:
                raise YAMLLimitError("recursive alias (an anchor that contains itself)", node.start_mark)
            on_path.add(nid)
            stack.append((node, True, depth))
            for k in kids:
                if id(k) not in size:
                    if id(k) in on_path:
                        raise YAMLLimitError("recursive alias (an anchor that contains itself)", k.start_mark)
                    stack.append((k, False, depth + 1))
            continue
        on_path.discard(nid)
        total = 1 + sum(size[id(k)] for k in kids)
        if total > MAX_NODES:
            # every node below this one is sized by now: when they are (nearly) as many as the expanded
            # count, the document is just large; far fewer means aliases multiply it
            if len(size) + 1 >= MAX_NODES:
                raise YAMLLimitError(
                    f"the document holds more than {MAX_NODES:,} values; configs and recipes are far smaller "
                    "(keep data in files that the recipe names by path)",
                    node.start_mark,
                )
            raise YAMLLimitError(
                f"the document expands to more than {MAX_NODES:,} values through aliases (an alias bomb?); "
                "YAML anchors/aliases must not multiply the document",
                node.start_mark,
            )
        size[nid] = total


def load(text: str | bytes) -> Any:
    """Parse one YAML document with SafeLoader; YAMLError (or YAMLLimitError) on bad input."""
    if len(text) > MAX_BYTES:
        raise YAMLLimitError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return yaml.load(text, Loader=SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as e:  # the pure-Python parser on a deeply nested document
        raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels") from e
