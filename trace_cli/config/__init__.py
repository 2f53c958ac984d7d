"""YAML loading, `--set` overrides and JSON-Schema validation that reports every error with its path."""

from trace_cli.config.loading import apply_overrides, load_document, parse_override
from trace_cli.config.schemas import SCHEMA_BY_KIND, load_schema, validate, validate_file

__all__ = [
    "SCHEMA_BY_KIND",
    "apply_overrides",
    "load_document",
    "load_schema",
    "parse_override",
    "validate",
    "validate_file",
]
