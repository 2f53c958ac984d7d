"""Identity of an environment reference for artifact ids: a canonical (name, params), or a store artifact."""

from __future__ import annotations

from typing import Any


def env_identity(ref: str | dict[str, Any], *, store: Any = None) -> dict[str, Any]:
    """{"id": canonical form, "inputs": [artifact inputs]}: equal environments give equal ids however they
    are spelled (`shop?families=a` == {"name": "shop", "params": {"families": ["a"]}})."""
    from trace_cli.envs.registry import MIXTURE, parse_env_ref

    if isinstance(ref, str) and ref.startswith("store://"):
        if store is None:
            from trace_cli.errors import UsageError

            raise UsageError(f"environment reference {ref!r} needs a store")
        art = store.resolve(ref, kind="environment")
        return {"id": {"artifact": art.id}, "inputs": [art.as_input("environment")]}
    name, params = parse_env_ref(ref)
    if name == MIXTURE:  # its members' identities, in order (the order decides which seed plays which)
        from trace_cli.envs.mixture import members_of

        parts = [env_identity(m, store=store) for m in members_of(params)]
        inputs = [i for p in parts for i in p["inputs"]]
        return {"id": {"name": name, "members": [p["id"] for p in parts]}, "inputs": inputs}
    norm = {k: (v if not isinstance(v, str) or "," not in v else v.split(",")) for k, v in params.items()}
    for k, v in norm.items():
        if not isinstance(v, list) and k == "families":
            norm[k] = [v]
    ident: dict[str, Any] = {"name": name, "params": norm}
    data = _data_identity(name, norm)
    if data is not None:
        ident["data"] = data  # e.g. a τ²-bench domain's fingerprint: other data, another id
    return {"id": ident, "inputs": []}


def _data_identity(name: str, params: dict[str, Any]) -> Any:
    """What a factory says identifies the data behind it (`factory.identity(params)`), if it says anything."""
    from trace_cli.envs.registry import get_factory
    from trace_cli.errors import NotFoundError

    try:
        factory = get_factory(name)
    except NotFoundError:
        return None
    identity = getattr(factory, "identity", None)
    if not callable(identity):
        return None
    from trace_cli.envs.registry import HINT_SHARE, takes_param

    if not takes_param(factory, HINT_SHARE):  # the registry's own parameter, not the factory's
        params = {k: v for k, v in params.items() if k != HINT_SHARE}
    return identity(params)
