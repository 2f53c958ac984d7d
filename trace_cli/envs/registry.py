"""Environment registry: short name -> factory, from built-ins, `register()` and the `trace_cli.environments` entry points.

References:
  "shop"                                       name only
  "shop?families=cancel_order,multi_op&n_orders=6"  name + query parameters
  {"name": "shop", "params": {"n_orders": 6}}  dict form (configs)
  "store://environment/<name or id>"           a synthesized environment artifact (needs `store=`)
  "<name>" with store=                         the same, when <name> is not a registered environment
Query values are read as int/float/bool when they look like one, as a list when they contain commas,
else as text; factories validate and coerce their own parameters.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import parse_qsl

from trace_cli.envs.base import Environment
from trace_cli.errors import NotFoundError, UsageError, shown

ENTRY_POINT_GROUP = "trace_cli.environments"

EnvFactory = Callable[..., Environment]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")

# Built-ins are imported lazily ("module:attr") so that importing the registry stays cheap.
_BUILTINS: dict[str, str] = {
    "shop": "trace_cli.envs.shop:make_shop_env",
    "shop-mixed": "trace_cli.envs.shop:make_shop_mixed_env",
    "shop-ladder": "trace_cli.envs.ladder:make_shop_ladder_env",
    "tau2-retail": "trace_cli.envs.tau2:make_retail",
    "tau2-airline": "trace_cli.envs.tau2:make_airline",
    "tau2-telecom": "trace_cli.envs.tau2:make_telecom",
}
# several environments' tasks in equal shares (envs/mixture.py); built by make_env itself (members need the store)
MIXTURE = "mixture"
# other spellings of a built-in name (τ²-bench's own `domain` names, prefixed)
ALIASES = {"tau2:retail": "tau2-retail", "tau2:airline": "tau2-airline", "tau2:telecom": "tau2-telecom"}
_REGISTERED: dict[str, EnvFactory] = {}


def register(name: str, factory: EnvFactory, *, overwrite: bool = False) -> None:
    """Register `factory(**params) -> Environment` under `name` (wins over built-ins and entry points)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(
            f"invalid environment name {name!r} (letters, digits, '_', '-', '.'; starts with a letter)"
        )
    if not callable(factory):
        raise UsageError(f"environment factory for {name!r} is not callable")
    if name in _REGISTERED and not overwrite:
        raise UsageError(f"environment {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTERED[name] = factory


def unregister(name: str) -> None:
    """Remove a name added with `register` (tests and plugins that re-register)."""
    _REGISTERED.pop(name, None)


def _entry_points() -> dict[str, Any]:
    # Scanned on every call rather than cached: plugins installed while the process runs (and tests that
    # put a dist-info on sys.path) are found without a restart; the scan is cheap.
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def list_envs() -> list[str]:
    """Every known environment name, sorted."""
    return sorted(set(_BUILTINS) | set(_REGISTERED) | set(_entry_points()) | {MIXTURE})


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_factory(name: str) -> EnvFactory:
    """The factory for `name`: registered first, then built-in, then entry point."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTINS:
        return _load(_BUILTINS[name])
    ep = _entry_points().get(name)
    if ep is None:
        known = ", ".join(list_envs()) or "none"
        raise NotFoundError(f"unknown environment {name!r}; known environments: {known}")
    try:
        factory = ep.load()
    except Exception as exc:  # a broken plugin must not look like a missing one
        raise UsageError(f"environment {name!r} (entry point {ep.value!r}) failed to load: {exc}") from exc
    if not callable(factory):
        raise UsageError(f"environment {name!r}: entry point {ep.value!r} is not callable")
    return factory


def _parse_value(text: str) -> Any:
    if "," in text:
        return [_parse_value(part) for part in text.split(",") if part != ""]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if re.fullmatch(r"-?(0|[1-9]\d*)", text):  # "007" stays text: leading zeros matter (zip codes)
        if len(text.lstrip("-")) > sys.get_int_max_str_digits():
            raise UsageError(
                f"{shown(text, limit=40)}: a number longer than {sys.get_int_max_str_digits()} digits"
            )
        return int(text)
    if re.fullmatch(r"-?\d+\.\d+", text):
        return float(text)
    return text


def parse_env_ref(ref: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split a reference into (name, params); raise UsageError on a malformed one."""
    if isinstance(ref, dict):
        extra = sorted(set(ref) - {"name", "params"})
        if extra:
            raise UsageError(
                f"environment reference has unknown key {extra[0]!r} (expected 'name' and 'params')"
            )
        name, params = ref.get("name"), ref.get("params") or {}
        if not isinstance(params, dict):
            raise UsageError(f"environment 'params' must be a mapping, got {type(params).__name__}")
    elif isinstance(ref, str):
        name, _, query = ref.strip().partition("?")
        params = {}
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            if key in params:
                raise UsageError(f"environment parameter '{key}' is given twice in {ref!r}")
            params[key] = _parse_value(value)
        if query and not params:
            raise UsageError(f"cannot parse parameters {query!r} in environment reference {ref!r}")
    else:
        raise UsageError(f"environment reference must be a string or a mapping, got {type(ref).__name__}")
    name = ALIASES.get(name, name) if isinstance(name, str) else name
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"invalid environment name {name!r} in reference {ref!r}")
    return name, dict(params)


def _check_params(name: str, factory: EnvFactory, params: dict[str, Any]) -> None:
    """Reject parameters the factory's signature cannot take, naming the first one."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # some callables (builtins, C extensions) have no signature; let the call decide
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return  # the factory validates its own **params
    accepted = {
        k
        for k, p in sig.parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    for key in params:
        if key not in accepted:
            known = ", ".join(sorted(accepted)) or "none"
            raise UsageError(f"environment {name!r} has no parameter '{key}'; known parameters: {known}")


def _load_from_store(store: Any, ref: str, **params: Any) -> Environment:
    """Build a synthesized environment from an `environment` artifact: `store://environment/NAME_OR_ID`
    (or a bare NAME_OR_ID); keyword `params` override the stored ones (see `trace_cli.envs.loading`)."""
    from pathlib import Path

    from trace_cli.envs.loading import load_environment

    if isinstance(store, (str, Path)):
        from trace_cli.store import Store

        store = Store(store)
    if not hasattr(store, "resolve"):
        raise NotFoundError(f"environment artifact {ref!r} not found: {store!r} is not a store")
    return load_environment(store.resolve(ref, kind="environment"), **params)


def make_env(ref: str | dict[str, Any], *, store: Any = None, **params: Any) -> Environment:
    """Build an environment from a reference; keyword `params` override those in the reference."""
    if isinstance(ref, str) and ref.startswith("store://"):
        if store is None:
            raise UsageError(f"environment reference {ref!r} needs a store (pass store=...)")
        return _load_from_store(store, ref, **params)
    name, ref_params = parse_env_ref(ref)
    ref_params.update(params)
    if name == MIXTURE:  # its members may be store artifacts: built here, where the store is
        from trace_cli.envs.mixture import MixtureEnv, members_of

        return MixtureEnv([make_env(m, store=store) for m in members_of(ref_params)])
    try:
        factory = get_factory(name)
    except NotFoundError:
        if store is None:
            raise
        # not a registered name: maybe a synthesized environment artifact in the given store
        try:
            return _load_from_store(store, name, **ref_params)
        except NotFoundError:
            pass
        raise
    share = None
    if HINT_SHARE in ref_params and not takes_param(factory, HINT_SHARE):
        share = _hint_share(name, ref_params.pop(HINT_SHARE))
    _check_params(name, factory, ref_params)
    env = factory(**ref_params)
    if not isinstance(env, Environment):
        raise UsageError(
            f"environment {name!r}: factory returned {type(env).__name__}, which does not implement "
            "reset/step/verify/task_metadata/reference_actions"
        )
    if share is not None:
        env.hint_share = share  # read by GRPO's rollouts (training.grpo_rollout): hinted episodes per group
    return env


# Any registered environment takes `hint_share=X`: that share of each GRPO group's episodes sees the task's
# `<expert_guidance>` (built from its reference actions; envs.synthetic.hints), the gradient step the plain prompt:
# GRPO on a target with the hints a calibrated environment gets (the curriculum-matched baseline of issue 44).
HINT_SHARE = "hint_share"


def takes_param(factory: EnvFactory, key: str) -> bool:
    try:
        return key in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _hint_share(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UsageError(f"environment {name!r}: hint_share must be a number in [0, 1), got {value!r}")
    return float(value)
