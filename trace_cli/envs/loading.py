"""The environment of an `environment` artifact: its template (envs.synthetic) with its params and tool schemas,
or its module run in the sandbox (envs.sandbox). Above both, so that the artifact's files (envs.artifact), which
the synthetic authoring writes, stay below them."""

from __future__ import annotations

import json
from typing import Any

from trace_cli.envs.artifact import ENV_FILE, module_source, read_environment
from trace_cli.envs.base import Environment
from trace_cli.errors import UsageError

MODULE_FACTORIES: dict[tuple[str, str], Any] = {}  # one sandbox worker per artifact and params


def load_environment(art: Any, **params: Any) -> Environment:
    """The environment of an artifact: its template with its params and tool schemas, or its module in the
    sandbox; keyword `params` override the stored ones."""
    doc = read_environment(art)
    # The stored params are the effective knob values (reproducible even if a template's levels change);
    # asking for another `level` means that level's knobs, so the stored ones are dropped then.
    merged = dict(params) if "level" in params else {**(doc.get("params") or {}), **params}
    max_turns = merged.pop("max_turns", doc["max_turns"])  # environment.v1.json requires it
    if doc.get("source") == "template":
        from trace_cli.envs.synthetic import get_template

        tools = {t["function"]["name"]: t for t in doc.get("tools") or []}
        world = _world(art, doc)
        return get_template(doc["template"])(tools=tools, max_turns=max_turns, world=world, **merged)
    if doc.get("source") == "module":
        from trace_cli.envs.sandbox import module_env_factory

        world = _world(art, doc)
        if world != "shop":  # the module's make_env takes the world it was written for
            merged = {**merged, "world": world}

        key = (str(art.path), json.dumps(merged, sort_keys=True, default=str))
        if key not in MODULE_FACTORIES:  # shared by the instances
            MODULE_FACTORIES[key] = module_env_factory(module_source(art, doc.get("module")), merged)
        return MODULE_FACTORIES[key]()
    raise UsageError(
        f"{art.uri}: {ENV_FILE} has unknown source {doc.get('source')!r} (expected template or module)"
    )


def _world(art: Any, doc: dict[str, Any]) -> str:
    """The world an artifact's tasks live in (`world.name`; artifacts from before worlds: the shop), loaded: a
    world whose package is missing fails with its install hint, and one whose data changed since (its identity,
    e.g. τ²'s data fingerprint and the generator's version) fails too, naming both."""
    from trace_cli.envs.worlds import DEFAULT, get_world

    recorded = doc.get("world") or {"name": DEFAULT}
    try:
        world = get_world(recorded["name"])
    except UsageError as exc:
        raise UsageError(f"{art.uri}: its environment lives in world {recorded['name']!r}: {exc}") from None
    now = world.identity()
    if recorded["name"] != DEFAULT and now != recorded:
        diff = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
        raise UsageError(
            f"{art.uri}: synthesized on world {recorded['name']!r} as it was then ({', '.join(diff)} differ now); "
            "install the version it records or synthesize again",
            hint=json.dumps({k: recorded.get(k) for k in diff}, default=str)[:400],
        )
    return world.name
