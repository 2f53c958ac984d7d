"""The configuration reference (docs/config-reference.md), generated from the schemas in `trace_cli.schemas`.

Every key of every schema, nested ones as dotted paths (`calibration.seeds`; list items as `[]`), with its
type, default and description, one table per schema: the stage configs first, then the recipe, the serve
config and the artifact formats. The schemas are the one place a key is described, so the reference is never
written by hand: `make docs` (`python -m trace_cli.config.reference --out docs/config-reference.md`) rewrites
it, and tests/test_docs.py fails when it is stale or a key has no entry.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

HEADER = (
    "# Configuration reference\n\n"
    "Generated from the JSON Schemas in `trace_cli/schemas/` by `make docs` "
    "(`python -m trace_cli.config.reference --out docs/config-reference.md`); do not edit by hand. "
    "A stage command takes every key as `--config FILE` (YAML, `kind: STAGE`), `--set KEY=VALUE` "
    "(dotted for nested keys) and, for top-level keys, as its own option; a recipe step takes them under "
    "`with:`. Precedence: schema default < `--config` < options < `--set`. Unknown keys are errors.\n"
)


def schema_files() -> list[tuple[str, dict[str, Any]]]:
    """(relative name, schema) of every schema shipped: stage configs first, then the others, each sorted."""
    root = resources.files("trace_cli.schemas")
    out = []
    for sub in ("config", ""):
        base = root / sub if sub else root
        for f in sorted(base.iterdir(), key=lambda p: p.name):
            if f.name.endswith(".json"):
                out.append((f"{sub}/{f.name}" if sub else f.name, json.loads(f.read_text(encoding="utf-8"))))
    return out


def keys(node: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, subschema) of every key under `node`, through properties, list items, the alternatives
    of oneOf/anyOf/allOf, a schema for additional properties (`KEY.*`) and $defs (`$defs.NAME.KEY`)."""
    if not isinstance(node, dict):
        return
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, sub
        yield from keys(sub, path)
    items = node.get("items")
    if isinstance(items, dict):
        yield from keys(items, f"{prefix}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and (extra.get("properties") or extra.get("items")):
        yield from keys(extra, f"{prefix}.*" if prefix else "*")
    for alt in ("oneOf", "anyOf", "allOf"):
        for sub in node.get(alt) or []:
            yield from keys(sub, prefix)
    for name, sub in (node.get("$defs") or {}).items():
        yield from keys(sub, f"$defs.{name}")


def _type(s: dict[str, Any]) -> str:
    if "const" in s:
        return f"const {json.dumps(s['const'])}"
    if "enum" in s:
        return " \\| ".join(json.dumps(v) for v in s["enum"])
    if "$ref" in s:
        return f"see {s['$ref'].rsplit('/', 1)[-1]}"
    t = s.get("type")
    if isinstance(t, list):
        return " \\| ".join(t)
    if t:
        return str(t) + (
            f" of {_type(s['items'])}" if t == "array" and isinstance(s.get("items"), dict) else ""
        )
    alts = [_type(a) for a in (s.get("oneOf") or s.get("anyOf") or []) if isinstance(a, dict)]
    return " \\| ".join(dict.fromkeys(a for a in alts if a)) or "any"


def _description(s: dict[str, Any]) -> str:
    d = s.get("description") or s.get("title") or ""
    if not d and "const" in s:
        d = f"must be {json.dumps(s['const'])} when given (what a YAML file configures)"
    if not d:
        for alt in s.get("oneOf") or s.get("anyOf") or []:
            if isinstance(alt, dict) and alt.get("description"):
                d = alt["description"]
                break
    return " ".join(str(d).split()).replace("|", "\\|")


def entries(schema: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Dotted key -> {type, default, description}; a key met in several alternatives keeps its first entry,
    filled in from the others where it said nothing."""
    out: dict[str, dict[str, str]] = {}
    for path, s in keys(schema):
        if not isinstance(s, dict):
            continue
        e = {
            "type": _type(s),
            "default": json.dumps(s["default"]) if "default" in s else "",
            "description": _description(s),
        }
        if path in out:
            for k, v in e.items():
                out[path][k] = out[path][k] or v
        else:
            out[path] = e
    return out


def render() -> str:
    parts = [HEADER]
    for name, schema in schema_files():
        title = " ".join(str(schema.get("title") or name).split())
        parts.append(f"\n## `{name}`\n\n{title}.")
        desc = " ".join(str(schema.get("description") or "").split())
        if desc:
            parts.append(f" {desc}")
        parts.append("\n\n| key | type | default | description |\n| --- | --- | --- | --- |\n")
        for path, e in entries(schema).items():
            default = f"`{e['default']}`" if e["default"] else ""
            parts.append(
                f"| `{path}` | {e['type']} | {default.replace('|', chr(92) + '|')} | {e['description']} |\n"
            )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write here (default: stdout)")
    args = ap.parse_args(argv)
    text = render()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
