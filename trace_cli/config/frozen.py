"""Read-only configs: what a stage runs with is what its manifest records, so nothing may change it on the way.

`freeze` turns a validated config (dicts and lists, as YAML and JSON give them) into `FrozenDict`/`FrozenList`:
subclasses of dict and list, so `cfg["key"]`, `cfg.get`, `isinstance(x, dict)`, `json.dumps`, `yaml.safe_dump`
and JSON-Schema validation work unchanged, while every mutating method raises TypeError. A stage's resolved
config is a `StageConfig` (a FrozenDict that knows its stage). `thaw` gives back plain, mutable copies, and so
do `copy.copy`/`copy.deepcopy`: a copy is taken to be changed. Pickling keeps an object frozen.
"""

from __future__ import annotations

from typing import Any

import yaml


def _read_only(self, *args, **kwargs):
    raise TypeError(
        f"{type(self).__name__} is read-only (a stage's config cannot change once resolved); "
        "thaw() it for a copy you may change"
    )


class _Frozen:
    """What FrozenDict and FrozenList share: pickled frozen, copied plain."""

    __slots__ = ()
    _plain: type = object  # the mutable type it reads as (dict or list)

    def __reduce__(self):
        return (type(self), (self._plain(self),))

    def __copy__(self):
        return self._plain(self)

    def __deepcopy__(self, memo):
        return thaw(self)


class FrozenDict(_Frozen, dict):
    """A dict whose contents cannot change (its values are frozen too, by `freeze`)."""

    __slots__ = ()
    _plain = dict
    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only


class FrozenList(_Frozen, list):
    """A list whose contents cannot change (its items are frozen too, by `freeze`)."""

    __slots__ = ()
    _plain = list
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = pop = remove = reverse = sort = clear = _read_only


class StageConfig(FrozenDict):
    """The validated, defaulted config one stage invocation runs with (`Prepared.config`)."""

    __slots__ = ("stage",)

    def __init__(self, items=(), stage: str = ""):
        super().__init__(items)
        self.stage = stage

    def __reduce__(self):
        return (type(self), (dict(self), self.stage))

    def __repr__(self) -> str:
        return f"StageConfig({self.stage!r}, {dict.__repr__(self)})"


def freeze(value: Any) -> Any:
    """A read-only deep copy of a JSON-like value (dicts -> FrozenDict, lists -> FrozenList)."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    return value


def freeze_stage_config(stage: str, config: dict[str, Any]) -> StageConfig:
    return StageConfig(((k, freeze(v)) for k, v in config.items()), stage=stage)


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy (the inverse of `freeze`)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    if isinstance(value, tuple):
        return tuple(thaw(v) for v in value)
    return value


# Artifacts write configs (or parts of them) with yaml.safe_dump, which knows only exact dicts and lists.
for _dumper in {yaml.SafeDumper, getattr(yaml, "CSafeDumper", yaml.SafeDumper)}:
    _dumper.add_multi_representer(FrozenDict, yaml.representer.SafeRepresenter.represent_dict)
    _dumper.add_multi_representer(FrozenList, yaml.representer.SafeRepresenter.represent_list)
