"""JSON Schema 2020-12 validation against the versioned schemas shipped in `trace_cli.schemas`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from trace_cli.errors import ValidationError, json_error

SCHEMA_BASE = "https://trace-cli.dev/schemas/"

# Which schema validates a document with a given top-level `kind`.
SCHEMA_BY_KIND: dict[str, str] = {
    "recipe": "recipe.v1.json",
    "manifest": "manifest.v1.json",
    "episode": "episode.v1.json",
    "capabilities": "capabilities.v1.json",
    "diagnosis": "diagnosis.v1.json",
    "environment": "environment.v1.json",
    "composition": "composition.v1.json",
}


def _schema_files() -> dict[str, Any]:
    root = resources.files("trace_cli.schemas")
    found: dict[str, Any] = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json"):
            found[entry.name] = entry
    cfg = root / "config"
    if cfg.is_dir():
        for entry in cfg.iterdir():
            if entry.name.endswith(".json"):
                found[f"config/{entry.name}"] = entry
    return found


@cache
def _registry():
    from referencing import Registry, Resource

    resources_ = []
    for _name, entry in _schema_files().items():
        doc = json.loads(entry.read_text(encoding="utf-8"))
        resources_.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources_)


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load a schema by file name (`recipe.v1.json`, `config/ingest.v1.json`)."""
    files = _schema_files()
    if name not in files:
        raise KeyError(f"no schema named {name!r}; have {sorted(files)}")
    return json.loads(files[name].read_text(encoding="utf-8"))


def stage_config_schemas() -> dict[str, str]:
    """Stage name -> its config schema file, for every `config/<stage>.v1.json` shipped."""
    return {n.split("/", 1)[1].split(".")[0]: n for n in _schema_files() if n.startswith("config/")}


def format_path(path: Iterable[Any]) -> str:
    """['steps', 1, 'with', 'lora', 'rank'] -> 'steps[1].with.lora.rank' ('<root>' when empty)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def _messages(error) -> list[tuple[list[Any], str]]:
    """One (path, message) per problem; unknown keys become one error each, at their own path; a `not` that
    has a `description` (a schema refusing a key in some case, e.g. another method's key) says that instead."""
    path = list(error.absolute_path)
    if error.validator == "not" and isinstance(error.schema, dict) and error.schema.get("description"):
        return [(path, error.schema["description"])]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        patterns = error.schema.get("patternProperties", {})
        import re

        extra = [k for k in error.instance if k not in allowed and not any(re.search(p, k) for p in patterns)]
        if extra:
            from difflib import get_close_matches

            hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
            out = []
            for k in extra:
                near = get_close_matches(str(k), sorted(allowed), n=1, cutoff=0.6)
                dym = f"; did you mean {near[0]!r}?" if near else ""
                out.append((path + [k], f"unknown key{dym}{hint}"))
            return out
    if error.validator == "unevaluatedProperties" and isinstance(error.instance, dict):
        return [(path, error.message)]
    if error.validator in ("oneOf", "anyOf") and error.context:
        # Report the branch that got furthest, which is what the user most likely meant.
        from jsonschema.exceptions import best_match

        best = best_match(error.context)
        return _messages(best)
    return [(path, error.message)]


@cache
def _validator(schema_name: str):
    """One compiled validator per shipped schema (building one per record made JSONL ingest 8x slower)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema(schema_name), registry=_registry())


def validate(doc: Any, schema_name: str | dict[str, Any], *, source: str | None = None) -> None:
    """Raise ValidationError listing every problem as `path: message`; return None when valid.

    `schema_name` is a shipped schema's file name, or a schema document itself (a stage's CONFIG_SCHEMA).
    """
    if isinstance(schema_name, str):
        validator = _validator(schema_name)
    else:
        from jsonschema import Draft202012Validator

        validator = Draft202012Validator(schema_name, registry=_registry())
    if validator.is_valid(doc):  # the fast path: ingest validates every record
        return
    problems: list[tuple[list[Any], str]] = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        problems.extend(_messages(err))
    if problems:
        seen = dict.fromkeys(f"{format_path(p)}: {m}" for p, m in problems)  # ordered, linear de-dup
        raise ValidationError(list(seen), source=source)


def schema_for(doc: Any, path: Path | None = None) -> str:
    """Pick the schema for a document by its `kind` (stage configs use the stage name as kind)."""
    from trace_cli.errors import UsageError

    if path is not None and path.name == "manifest.yaml":
        return SCHEMA_BY_KIND["manifest"]
    if not isinstance(doc, dict):
        raise UsageError(f"{path or 'document'}: expected a mapping with a `kind` key at the top")
    kind = doc.get("kind")
    if kind in SCHEMA_BY_KIND:
        return SCHEMA_BY_KIND[kind]
    stages = stage_config_schemas()
    if kind in stages:
        return stages[kind]
    known = sorted(set(SCHEMA_BY_KIND) | set(stages))
    raise UsageError(
        f"{path or 'document'}: unknown or missing `kind` ({kind!r}); expected one of: {', '.join(known)}"
    )


def validate_file(path: str | Path) -> str:
    """Validate one YAML/JSON file (or each line of a .jsonl file) by its kind; return the schema used."""
    from trace_cli.config.loading import load_document
    from trace_cli.errors import InputError

    p = Path(path)
    if p.suffix == ".jsonl":
        errors: list[str] = []
        from trace_cli.config.loading import check_input_file

        check_input_file(p, expected="a JSONL file")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{p}: not a UTF-8 text file (byte {e.start}: {e.reason})") from e
        if not text.strip():
            raise InputError(f"{p}: the file is empty; expected one JSON episode per line")
        # lines end at "\n" only (and a "\r" before it): str.splitlines() would also split at U+2028, U+2029
        # and U+0085, which JSON allows raw inside strings
        for i, line in enumerate(text.split("\n"), start=1):
            if line.endswith("\r"):
                line = line[:-1]
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                validate(rec, SCHEMA_BY_KIND["episode"])
            except ValueError as e:  # JSONDecodeError, or a number too long to convert
                errors.append(f"line {i}: invalid JSON: {json_error(e)}")
            except RecursionError:
                errors.append(f"line {i}: JSON nested too deeply to read (deeper than ~900 levels)")
            except ValidationError as ve:
                errors.extend(f"line {i}: {e}" for e in ve.errors)
        if errors:
            raise ValidationError(errors, source=str(p))
        return SCHEMA_BY_KIND["episode"]
    doc = load_document(p)
    if doc is None:
        raise InputError(f"{p}: the file is empty")
    name = schema_for(doc, p)
    validate(doc, name, source=str(p))
    return name
