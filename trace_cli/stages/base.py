"""What every stage shares: config defaults + validation, content-derived ids, skip-if-up-to-date.

A stage sees its config read-only: `execute` hands `prepare` a frozen copy of what it was given, and
`Prepared.finalize` freezes the resolved config (a `StageConfig`) that `run` works from and the manifest
records, so no step between the id and the artifact can change what the id stands for.

A stage may fan out: its `fans_out(config)` says from the config's shape alone whether it asks for several
artifacts (synthesize without one capability; GRPO on a list of environments), and its `fan_out(config,
store)` splits it into one (key, config) per artifact, the key being the capability that artifact is for.
`execute_each` runs them for the CLI and for recipes alike, named NAME-KEY.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trace_cli.config.frozen import freeze
from trace_cli.config.layers import present
from trace_cli.config.schemas import validate
from trace_cli.errors import CheckFailed, UsageError
from trace_cli.stages.contract import Prepared, stage_options
from trace_cli.store import Artifact, Store


def apply_defaults(config: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Fill `default`s from the schema (recursively into nested objects), so an omitted default and an
    explicit one give the same config digest and the same artifact id."""
    out = copy.deepcopy(config)
    props = schema.get("properties", {})
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        kinds = sub.get("type")
        if isinstance(out.get(key), dict) and "object" in (kinds if isinstance(kinds, list) else [kinds]):
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
class Outcome:
    outputs: dict[str, Artifact]
    skipped: bool
    prepared: Prepared

    @property
    def main(self) -> Artifact:
        return next(iter(self.outputs.values()))


def prepare(stage_name: str, config: Mapping[str, Any], store: Store) -> Prepared:
    """Validate the config and resolve the stage's inputs and output id, before any compute."""
    from trace_cli.stages import get_stage

    return get_stage(stage_name).prepare(freeze(dict(config or {})), store)


def execute(
    stage_name: str,
    config: dict[str, Any],
    store: Store,
    *,
    name: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
    force: bool = False,
) -> Outcome:
    """Prepare (validate everything), then skip if up to date, else run: one artifact. The one way the CLI and
    recipes run a stage, directly or, for a config that may fan out, per member through `execute_each`."""
    return _complete(
        stage_name, prepare(stage_name, config, store), store, name=name, overrides=overrides, force=force
    )


def _complete(
    stage_name: str, prepared: Prepared, store: Store, *, name=None, overrides=None, force=False
) -> Outcome:
    from trace_cli.stages import get_stage

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
    stage = get_stage(stage_name)
    remember = stage_options(stage).CACHE_FAILURES
    if remember and not force:
        cached = read_failure(store, stage_name, prepared.id)
        if cached is not None:
            err = CheckFailed(
                f"{cached['message']}\n(a cached failure of this exact config and inputs, "
                f"{cached['created_at']}; nothing was run again — --force runs it again)"
            )
            err.details = {**cached.get("details", {}), "cached": True}
            raise err
    try:
        outputs = stage.run(prepared, store, name=name, overrides=overrides or [], replace=force)
    except CheckFailed as e:
        if remember:
            write_failure(store, stage_name, prepared.id, e)
        raise
    return Outcome(outputs, False, prepared)


# ------------------------------------------------------------------------------------------------ failures
# A stage whose checks failed after real compute (a calibration out of band) records the failure, keyed by its
# id, so that the same config and inputs fail at once, with the same numbers, instead of running again.
FAILURES = "failures"


def _failure_path(store: Store, stage_name: str, id_: str):
    from trace_cli.store.layout import REQUEST_CACHE_DIR

    return store.root / REQUEST_CACHE_DIR / FAILURES / f"{stage_name}-{id_}.json"


def read_failure(store: Store, stage_name: str, id_: str) -> dict[str, Any] | None:
    import json

    p = _failure_path(store, stage_name, id_)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def write_failure(store: Store, stage_name: str, id_: str, err: CheckFailed) -> None:
    import datetime
    import json
    import os

    p = _failure_path(store, stage_name, id_)
    doc = {
        "stage": stage_name,
        "id": id_,
        "message": str(err),
        "details": getattr(err, "details", None) or {},
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, default=str, indent=1))
        tmp.replace(p)  # atomic: a reader sees the whole record or none
    except OSError:
        pass  # a store we cannot write to still reports the failure; it is only not remembered


# ------------------------------------------------------------------------------------------------ fan-out


def fans_out(stage_name: str, config: Mapping[str, Any]) -> bool:
    """Whether `config` asks the stage for one artifact per capability: known from its shape alone, before any
    input is read, so a recipe knows at load time which step outputs are lists."""
    from trace_cli.stages import get_stage

    hook = stage_options(get_stage(stage_name)).fans_out
    return bool(hook and hook(config))


def fan_out(stage_name: str, config: Mapping[str, Any], store: Store) -> list[tuple[str | None, dict]]:
    """(key, config) per artifact the config stands for: the stage's `fan_out` split (the config is
    schema-checked first, with every error), else the config itself under the key None."""
    from trace_cli.stages import get_stage

    if not fans_out(stage_name, config):
        return [(None, dict(config))]
    checked_config(stage_name, config)
    members = get_stage(stage_name).fan_out(freeze(dict(config)), store)
    keys = [k for k, _ in members]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise UsageError(f"{stage_name}: more than one artifact would be for {', '.join(map(repr, twice))}")
    return members


@dataclass
class Member:
    """One artifact of a (possibly fanned-out) invocation: its key, name, and Outcome or check failure."""

    key: str | None  # None: the invocation did not fan out
    name: str | None
    prepared: Prepared
    outcome: Outcome | None = None
    failure: CheckFailed | None = None


def execute_each(
    stage_name: str, config: dict[str, Any], store: Store, *, name=None, key_names=False, **options
) -> Iterator[Member]:
    """`execute` for each artifact of `fan_out` (`options`: execute's overrides and force), yielded as it
    finishes. Every member is prepared, and its name checked, before the first one runs, so a bad member fails
    before any compute. Members are named NAME-KEY (with `key_names` and no name: KEY). A member that fails its
    checks (CheckFailed, exit 1) is yielded with its failure and the others still run; `failed` words the
    summary. A single invocation raises as `execute`."""
    members = []
    for key, cfg in fan_out(stage_name, config, store):
        own = name
        if key is not None:
            own = f"{name}-{key}" if name else (key if key_names else None)
        if own is not None:
            store.check_name(own)
        members.append(Member(key, own, prepare(stage_name, cfg, store)))
    for m in members:
        try:
            m.outcome = _complete(stage_name, m.prepared, store, name=m.name, **options)
        except CheckFailed as e:
            if m.key is None:
                raise
            m.failure = e
        yield m


def failed(stage_name: str, members: list[Member]) -> CheckFailed | None:
    """The error a fanned-out invocation ends with when some of its members failed their checks, else None."""
    from trace_cli.stages import get_stage

    keys = [str(m.key) for m in members if m.failure is not None]
    if not keys:
        return None
    n = len(members)
    what = stage_options(get_stage(stage_name)).FAN_OUT_FAILURE
    return CheckFailed(f"{len(keys)} of {n} capabilit{'y' if n == 1 else 'ies'} {what}: {', '.join(keys)}")
