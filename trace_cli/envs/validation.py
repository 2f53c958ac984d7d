"""Check a tool call's arguments against its OpenAI-format JSON schema and return short error texts.

A deliberately small subset of JSON Schema (type, properties, required, additionalProperties, enum,
items, minItems): the tool schemas environments expose use nothing more, and hand-rolled checks give the
compact, agent-readable messages that tool results need (and are fast enough for thousands of episodes).
"""

from __future__ import annotations

from typing import Any

from trace_cli.errors import json_error

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else list(expected)
    for name in names:
        py = _TYPES.get(name)
        if py is None:
            continue
        # bool is a subclass of int in Python, but JSON Schema keeps them apart.
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, py):
            return True
    return False


def _check(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    expected = schema.get("type")
    if expected is not None and not _type_ok(value, expected):
        errors.append(f"{path} must be of type {expected}, got {type(value).__name__}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path} must be one of {schema['enum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path} needs at least {schema['minItems']} item(s)")
        item_schema = schema.get("items")
        if item_schema:
            for i, item in enumerate(value):
                _check(item, item_schema, f"{path}[{i}]", errors)
    if isinstance(value, dict) and ("properties" in schema or "required" in schema):
        _check_object(value, schema, path, errors)


def _check_object(value: dict[str, Any], schema: dict[str, Any], path: str, errors: list[str]) -> None:
    props = schema.get("properties", {})
    prefix = f"{path}." if path else ""
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"missing required argument '{prefix}{name}'")
    if schema.get("additionalProperties", True) is False:
        for name in value:
            if name not in props:
                errors.append(f"unexpected argument '{prefix}{name}'")
    for name, sub in props.items():
        if name in value:
            _check(value[name], sub, f"'{prefix}{name}'", errors)


def validate_arguments(tool: dict[str, Any], arguments: Any) -> list[str]:
    """Return the list of problems with `arguments` for `tool` (an OpenAI function definition); [] if valid."""
    params = tool.get("function", tool).get("parameters", {"type": "object"})
    if not isinstance(arguments, dict):
        return [f"arguments must be a JSON object, got {type(arguments).__name__}"]
    errors: list[str] = []
    _check_object(arguments, params, "", errors)
    return errors


def decode_tool_call(action: dict[str, Any], tools: dict[str, dict[str, Any]]) -> tuple[str, Any, str | None]:
    """(name, arguments, error observation or None) for a tool-call action against the exposed `tools`:
    unknown tools and unparsable JSON-string arguments (the OpenAI transport form) become error texts."""
    name, args = action.get("name"), action.get("arguments", {})
    if not isinstance(name, str) or name not in tools:
        return str(name), args, f"Error: unknown tool {name!r}"
    if isinstance(args, str):
        import json

        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            return name, args, f"Error: arguments are not valid JSON ({json_error(exc)})"
    return name, args, None
