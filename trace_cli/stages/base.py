"""What every stage shares: config defaults + validation, content-derived ids, skip-if-up-to-date.

A stage sees its config read-only: `execute` hands `prepare` a frozen copy of what it was given, and
`Prepared.finalize` freezes the resolved config (a `StageConfig`) that `run` works from and the manifest
records, so no step between the id and the artifact can change what the id stands for.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trace_cli.config.frozen import freeze, freeze_stage_config, thaw
from trace_cli.config.layers import present
from trace_cli.config.schemas import validate
from trace_cli.store import Artifact, Store


def apply_defaults(config: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Fill `default`s from the schema (recursively into nested objects), so an omitted default and an
    explicit one give the same config digest and the same artifact id."""
    out = copy.deepcopy(config)
    props = schema.get("properties", {})
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if isinstance(out.get(key), dict) and sub.get("type") == "object":
            out[key] = apply_defaults(out[key], sub)
    return out


def checked_config(
    stage: str, config: Mapping[str, Any] | None, *, source: str | None = None
) -> dict[str, Any]:
    """Validate a stage config against `config/<stage>.v1.json` (or the stage's CONFIG_SCHEMA), reporting
    all errors at once, and fill defaults. Returns a mutable copy for `prepare` to finish resolving (paths,
    digests, method defaults); `Prepared.finalize` freezes the result."""
    from trace_cli.stages import config_schema

    schema = config_schema(stage)
    cfg = present(config)
    validate(cfg, schema, source=source)
    cfg = apply_defaults(cfg, schema)
    cfg.pop("kind", None)
    return cfg


@dataclass
class Prepared:
    """A stage invocation resolved before any compute: config, inputs with digests, and the output id."""

    stage: str
    config: Mapping[
        str, Any
    ]  # the full config (with defaults), recorded in the manifest; read-only once final
    id_config: dict[str, Any]  # what enters the id (e.g. file paths replaced by their content digests)
    inputs: list[dict[str, Any]]
    outputs: dict[str, str]  # output name -> artifact kind
    id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # resolved objects the run needs (artifacts, envs)

    def finalize(self) -> Prepared:
        self.id = Store.compute_id(self.stage, self.id_config, self.inputs)
        self.config = freeze_stage_config(self.stage, self.config)
        return self

    def writer(self, store: Store, kind: str, *, name=None, overrides=None, replace: bool = False):
        """`store.writer` for this invocation's output of `kind`: its stage, config, inputs, seed (if the
        config has one) and id."""
        return store.writer(
            kind,
            self.stage,
            thaw(self.config),
            self.inputs,
            name=name,
            overrides=overrides,
            seed=self.config.get("seed"),
            id=self.id,
            replace=replace,
        )

    def existing(self, store: Store) -> dict[str, Artifact] | None:
        """The outputs, if every one of them is already in the store (the step is up to date)."""
        if not all(store.exists(kind, self.id) for kind in self.outputs.values()):
            return None
        return {name: store.get(kind, self.id) for name, kind in self.outputs.items()}


@dataclass
class Outcome:
    outputs: dict[str, Artifact]
    skipped: bool
    prepared: Prepared

    @property
    def main(self) -> Artifact:
        return next(iter(self.outputs.values()))


def execute(
    stage_name: str,
    config: dict[str, Any],
    store: Store,
    *,
    name: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
    force: bool = False,
) -> Outcome:
    """Prepare (validate everything), then skip if up to date, else run. The one entry point for CLI and recipes."""
    from trace_cli.stages import get_stage

    mod = get_stage(stage_name)
    prepared: Prepared = mod.prepare(freeze(dict(config or {})), store)
    if name is not None:
        store.check_name(name)
    if not force:
        found = prepared.existing(store)
        if found is not None:
            if name is not None:
                main_kind = next(iter(prepared.outputs.values()))
                store.set_name(main_kind, name, prepared.id)
                store.index_add(found[next(iter(found))])
            return Outcome(found, True, prepared)
    outputs = mod.run(prepared, store, name=name, overrides=overrides or [], replace=force)
    return Outcome(outputs, False, prepared)
