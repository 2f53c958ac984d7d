"""The built-in `shop` target world (τ²-bench-retail style) and its registry factory `make_shop_env`."""

from __future__ import annotations

from typing import Any

from trace_cli.envs.shop.env import POLICY, ShopEnv, ShopMixedEnv, family_capabilities
from trace_cli.envs.shop.tasks import CAPABILITIES, FAMILIES
from trace_cli.envs.shop.tools import TOOL_SCHEMAS
from trace_cli.errors import UsageError

__all__ = [
    "CAPABILITIES",
    "FAMILIES",
    "POLICY",
    "TOOL_SCHEMAS",
    "ShopEnv",
    "ShopMixedEnv",
    "family_capabilities",
    "make_shop_env",
    "make_shop_mixed_env",
]

_PARAMS = ("families", "max_turns", "n_orders", "tool_set")


def _as_int(name: str, value: Any) -> int:
    # Query strings deliver text ("6"); configs deliver ints. Both are fine, nothing else is.
    if isinstance(value, bool):
        raise UsageError(f"shop: parameter '{name}' must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise UsageError(f"shop: parameter '{name}' must be an integer, got {value!r}")


def make_shop_env(**params: Any) -> ShopEnv:
    """Factory registered as `shop`. Params: families (list or comma string), max_turns, n_orders, tool_set."""
    unknown = [k for k in params if k not in _PARAMS]
    if unknown:
        raise UsageError(f"shop: unknown parameter '{unknown[0]}'; known: {', '.join(_PARAMS)}")
    kwargs: dict[str, Any] = {}
    if "families" in params:
        fams = params["families"]
        if isinstance(fams, str):
            fams = [f.strip() for f in fams.split(",") if f.strip()]
        if not isinstance(fams, (list, tuple)) or not fams or not all(isinstance(f, str) for f in fams):
            raise UsageError(
                f"shop: parameter 'families' must be a non-empty list of names, got {params['families']!r}"
            )
        kwargs["families"] = list(fams)
    for name in ("max_turns", "n_orders"):
        if name in params:
            kwargs[name] = _as_int(name, params[name])
    if "tool_set" in params:
        kwargs["tool_set"] = params["tool_set"]
    return ShopEnv(**kwargs)


def make_shop_mixed_env(**params: Any) -> ShopMixedEnv:
    """Factory registered as `shop-mixed` (1-4 requests per task). Params: max_turns, n_orders, tool_set."""
    if "families" in params:
        raise UsageError("shop-mixed: parameter 'families' does not apply (its tasks mix requests); use shop")
    env = make_shop_env(**params)
    return ShopMixedEnv(**{k: getattr(env, k) for k in ("max_turns", "n_orders", "tool_set") if k in params})
