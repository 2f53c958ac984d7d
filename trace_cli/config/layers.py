"""A stage's config from layers, lowest first: the --config file < values given as flags < `--set KEY=VALUE`.
The schema's defaults lie under all three and are filled in by the stage (`stages.base.checked_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_cli.config.loading import apply_overrides, load_document, set_path
from trace_cli.errors import InputError


def present(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys a config sets: a null value means "not given", except for `seed` (null = a fresh seed)."""
    return {k: v for k, v in (config or {}).items() if v is not None or k == "seed"}


def get_path(doc: Mapping[str, Any], key: str) -> Any:
    """`doc["a"]["b"]` for the dotted key `a.b`; None where any part is missing."""
    node: Any = doc
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def read_config_file(path: str | Path, stage: str) -> dict[str, Any]:
    """A stage's --config file: a mapping of its config keys (an empty file is an empty config)."""
    doc = load_document(path)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InputError(
            f"{path}: expected a mapping of {stage} config keys (KEY: VALUE), got {type(doc).__name__}",
            hint=f"see schemas/config/{stage}.v1.json for the keys",
        )
    return dict(doc)


def layer(
    stage: str,
    *,
    file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The merged config and the record of what --set changed (for the manifest). `flags` maps dotted keys
    to values given on the command line (only those: a flag left at its default is no layer)."""
    cfg = read_config_file(file, stage) if file else {}
    for key, value in (flags or {}).items():
        set_path(cfg, key.split("."), value, label=f"{key} (from its flag)")
    return apply_overrides(cfg, list(overrides or []))
