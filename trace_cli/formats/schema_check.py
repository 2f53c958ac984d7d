"""A JSON Schema compiled once into one plain Python function that proves a document valid: the fast path of
JSONL ingest, which validates every record (jsonschema's `is_valid` costs ~100x more per episode).

`compile_check(schema)` reads the schema's keywords and generates straight-line code: `check(doc)` is True only
when every keyword holds, so True implies jsonschema finds the document valid; False means "ask jsonschema",
which then decides and words the errors. The check is deliberately strict where that is cheap and never
matters for JSON input (exact types: `1.0` is not an integer here, a bool is neither a number nor an integer),
so False can also come back for a document jsonschema accepts.

Only the keywords the shipped record schemas use are compiled (below); any other keyword, a `$ref` outside
`#/$defs/`, or a recursive `$ref` makes `compile_check` raise, so a schema change can never be half-checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# annotations: no effect on validity
_IGNORED = frozenset({"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"})
_KNOWN = _IGNORED | {
    "type",
    "const",
    "enum",
    "$ref",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
}

# A type test that asserts (exact types, as JSON parsers produce them) ...
_IS = {
    "object": "type({v}) is dict",
    "array": "type({v}) is list",
    "string": "type({v}) is str",
    "integer": "type({v}) is int",
    "number": "(type({v}) is int or type({v}) is float)",
    "boolean": "type({v}) is bool",
    "null": "{v} is None",
}
# ... and one that guards keywords of a type (any value jsonschema would apply them to, subclasses included).
_MAY_BE = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "number": "(isinstance({v}, (int, float)) and not isinstance({v}, bool))",
}
# which keywords apply to which instance type, and the types that make them apply unconditionally
_APPLIES = {
    "object": (("required", "properties", "additionalProperties"), {"object"}),
    "array": (("items", "minItems", "maxItems"), {"array"}),
    "string": (("minLength", "maxLength"), {"string"}),
    "number": (("minimum", "maximum"), {"number", "integer"}),
}
_SCALARS = (str, int, bool, type(None))


def compile_check(schema: dict[str, Any], name: str = "schema") -> Callable[[Any], bool]:
    """`check(doc) -> bool` for `schema` (see the module docstring); raises ValueError for what it cannot do."""
    gen = _Generator(schema, name)
    body = gen.node(schema, "doc", 1, "#")
    # the constants and builtins as defaults: read as fast locals, not looked up as globals
    fast = [*gen.constants, "type", "len", "isinstance", "dict", "list", "str", "int", "float", "bool"]
    lines = [f"def check(doc, {', '.join(f'{k}={k}' for k in fast)}):", *body, "    return True"]
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<compiled check of {name}>", "exec"), dict(gen.constants), namespace)  # noqa: S102
    check = namespace["check"]
    check.source = source  # for reading and debugging
    return check


class _Generator:
    def __init__(self, root: dict[str, Any], name: str):
        self.root = root
        self.name = name
        self.constants: dict[str, Any] = {}
        self.refs: list[str] = []  # the $refs being expanded (a recursive one cannot be inlined)
        self.n = 0

    def const(self, value: Any) -> str:
        key = f"_c{len(self.constants)}"  # a name in the generated code's globals
        self.constants[key] = value
        return key

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def fail(self, where: str, why: str) -> ValueError:
        return ValueError(
            f"{self.name}: {where}: {why}; the fast check does not compile it (add it to {__name__})"
        )

    def node(self, s: Any, v: str, depth: int, where: str) -> list[str]:
        """Lines that `return False` unless the value in variable `v` is valid against `s`."""
        if s is True or s == {}:
            return []
        if not isinstance(s, dict):
            raise self.fail(where, f"schema {s!r}")
        unknown = sorted(set(s) - _KNOWN)
        if unknown:
            raise self.fail(where, f"keyword {unknown[0]!r}")
        pad = "    " * depth
        out: list[str] = []
        if "$ref" in s:
            out += self.ref(s["$ref"], v, depth, where)
        types = s.get("type")
        if types is not None:
            types = [types] if isinstance(types, str) else list(types)
            if not types or any(t not in _IS for t in types):
                raise self.fail(where, f"type {s['type']!r}")
            out.append(f"{pad}if not ({' or '.join(_IS[t].format(v=v) for t in types)}): return False")
        for key in ("const", "enum"):
            if key in s:
                values = [s["const"]] if key == "const" else s["enum"]
                if not values or not all(type(x) in _SCALARS for x in values):
                    raise self.fail(where, f"{key} {s[key]!r} (strings, integers, booleans, null only)")
                by_type: dict[type, set[Any]] = {}  # per type: jsonschema tells 1 from True, a set does not
                for x in values:
                    by_type.setdefault(type(x), set()).add(x)
                if len(by_type) == 1:  # the usual case, and the cheaper test
                    ((kind, members),) = by_type.items()
                    test = f"{v} is None" if kind is type(None) else f"type({v}) is {self.const(kind)}"
                    if kind is not type(None):
                        test += f" and {v} in {self.const(frozenset(members))}"
                    out.append(f"{pad}if not ({test}): return False")
                else:
                    members = self.const({t: frozenset(xs) for t, xs in by_type.items()})
                    out.append(f"{pad}if {v} not in {members}.get(type({v}), ()): return False")
        for kind, (keywords, covering) in _APPLIES.items():
            if not any(k in s for k in keywords):
                continue
            sure = types is not None and set(types) <= covering  # the type test above already holds
            inner = depth if sure else depth + 1
            body = getattr(self, kind)(s, v, inner, where)
            if body and not sure:
                out.append(f"{pad}if {_MAY_BE[kind].format(v=v)}:")
            out += body
        return out

    def ref(self, ref: Any, v: str, depth: int, where: str) -> list[str]:
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            raise self.fail(where, f"$ref {ref!r} (only #/$defs/NAME)")
        if ref in self.refs:
            raise self.fail(where, f"recursive $ref {ref!r}")
        target = self.root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if target is None:
            raise self.fail(where, f"$ref {ref!r} names no definition")
        self.refs.append(ref)
        try:
            return self.node(target, v, depth, ref)
        finally:
            self.refs.pop()

    def object(self, s: dict[str, Any], v: str, depth: int, where: str) -> list[str]:
        pad = "    " * depth
        out: list[str] = []
        required = s.get("required", [])
        if required:
            out.append(f"{pad}if not ({' and '.join(f'{k!r} in {v}' for k in required)}): return False")
        props = s.get("properties", {})
        extra = s.get("additionalProperties", True)
        if extra is False:
            out.append(f"{pad}if not {v}.keys() <= {self.const(frozenset(props))}: return False")
        elif extra is not True:
            raise self.fail(where, "additionalProperties other than true/false")
        for k, sub in props.items():
            w = self.var()
            if k in required:
                body = self.node(sub, w, depth, f"{where}/properties/{k}")
                out += [f"{pad}{w} = {v}[{k!r}]", *body] if body else []
            else:
                body = self.node(sub, w, depth + 1, f"{where}/properties/{k}")
                out += [f"{pad}if {k!r} in {v}:", f"{pad}    {w} = {v}[{k!r}]", *body] if body else []
        return out

    def array(self, s: dict[str, Any], v: str, depth: int, where: str) -> list[str]:
        pad = "    " * depth
        out: list[str] = []
        if "minItems" in s:
            out.append(f"{pad}if len({v}) < {int(s['minItems'])}: return False")
        if "maxItems" in s:
            out.append(f"{pad}if len({v}) > {int(s['maxItems'])}: return False")
        if "items" in s:
            w = self.var()
            body = self.node(s["items"], w, depth + 1, f"{where}/items")
            out += [f"{pad}for {w} in {v}:", *body] if body else []
        return out

    def string(self, s: dict[str, Any], v: str, depth: int, where: str) -> list[str]:
        pad = "    " * depth
        out = []
        if "minLength" in s:
            out.append(f"{pad}if len({v}) < {int(s['minLength'])}: return False")
        if "maxLength" in s:
            out.append(f"{pad}if len({v}) > {int(s['maxLength'])}: return False")
        return out

    def number(self, s: dict[str, Any], v: str, depth: int, where: str) -> list[str]:
        pad = "    " * depth
        out = []
        for key, op in (("minimum", ">="), ("maximum", "<=")):
            if key in s:
                bound = s[key]
                if type(bound) not in (int, float):
                    raise self.fail(where, f"{key} {bound!r}")
                out.append(f"{pad}if not ({v} {op} {self.const(bound)}): return False")  # NaN: False
        return out
