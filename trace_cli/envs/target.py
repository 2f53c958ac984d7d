"""The target a synthesized environment is made for: a registered environment (its tools over its task families)
or a rollouts artifact (the tools its episodes define or call), with what identifies it in a stage's id."""

from __future__ import annotations

import json
from typing import Any

from trace_cli.errors import NotFoundError, UsageError, a
from trace_cli.store import Artifact, Store


def resolve_target(ref: Any, store: Store) -> dict[str, Any]:
    """{"kind": env|rollouts, "ref", "tools": {name: schema}, "identity", "inputs", "artifact", "world"}: `world` is
    the world the synthesized tasks live in (`envs.worlds.world_for_target`: `tau2-retail` for that target, else
    the shop)."""
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import list_envs, make_env, parse_env_ref
    from trace_cli.envs.synthetic import recover_tools
    from trace_cli.envs.worlds import DEFAULT, world_for_target

    def from_rollouts(art: Artifact) -> dict[str, Any]:
        tools = recover_tools(art)
        if not tools:
            raise UsageError(
                f"target {art.uri}: its episodes have no tool definitions and no tool calls to recover "
                "tools from"
            )
        return {
            "kind": "rollouts",
            "ref": art.uri,
            "tools": tools,
            "identity": {"rollouts": art.id},
            "inputs": [art.as_input("target")],
            "artifact": art.uri,
            "world": DEFAULT,
        }

    if isinstance(ref, str) and (ref.startswith("store://") or ref.split("/", 1)[0] in ("rollouts",)):
        art = store.resolve(ref)
        if art.kind != "rollouts":
            raise UsageError(
                f"target {ref!r} is {a(art.kind)} artifact; expected a registered environment "
                "(e.g. shop) or a rollouts artifact"
            )
        return from_rollouts(art)
    name, _ = parse_env_ref(ref)
    if name not in list_envs():
        try:
            return from_rollouts(store.resolve(name, kind="rollouts"))
        except NotFoundError:
            raise NotFoundError(
                f"target {ref!r} is neither a registered environment ({', '.join(list_envs())}) "
                "nor a rollouts artifact in the store"
            ) from None
    env = make_env(ref)
    tools: dict[str, Any] = {}
    for seed in range(24):  # the union of the tools the target exposes over its task families
        for t in env.reset(seed).tools:
            tools.setdefault(t["function"]["name"], t)
    ident = env_identity(ref)
    return {
        "kind": "env",
        "ref": ref if isinstance(ref, str) else json.dumps(ref, sort_keys=True),
        "tools": dict(sorted(tools.items())),
        "identity": ident["id"],
        "inputs": ident["inputs"],
        "artifact": None,
        "world": world_for_target(ref),
    }
