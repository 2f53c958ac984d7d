"""The stage contract (ARCHITECTURE.md, "The stage contract"): what `prepare` returns (`Prepared`), what a stage
module is (`Stage`, a declared interface as torchtune's recipe interfaces are), and the optional members with
their defaults, declared once (`StageOptions`). `stages.get_stage` checks a module against `Stage`; nothing
else reads a stage's attributes by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from trace_cli.config.frozen import freeze_stage_config, thaw
from trace_cli.store import Artifact, Store


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


@runtime_checkable
class Stage(Protocol):
    """A stage module: validate and resolve before any compute, then run and write its artifacts."""

    NAME: str
    OUTPUTS: Mapping[str, str]  # output role -> artifact kind

    def prepare(self, config: Mapping[str, Any], store: Store) -> Prepared:
        """Check the config against the stage's schema (defaults filled), resolve inputs to digests, compute
        the output id; everything that can fail without compute fails here (exit 2, nothing written)."""
        ...

    def run(
        self, prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False
    ) -> dict[str, Artifact]:
        """Do the work and write the outputs through `prepared.writer`."""
        ...


@dataclass(frozen=True)
class StageOptions:
    """The members a stage may define, and what its absence means."""

    PATH_KEYS: tuple[str, ...] = ()  # config keys holding paths relative to a recipe file
    CACHE_FAILURES: bool = False  # remember a failed check by id (the same run then fails at once)
    FAN_OUT_FAILURE: str = "failed"  # the verb of a fanned-out run's summary of failed members
    CONFIG_SCHEMA: dict[str, Any] | None = None  # a stage shipped outside the package: its config schema
    # fans_out(config) -> bool and fan_out(config, store) -> [(key, config)]: one artifact per capability
    fans_out: Callable[[Any], bool] | None = None
    fan_out: Callable[[Any, Store], list[tuple[str, dict[str, Any]]]] | None = None


def stage_options(stage: ModuleType) -> StageOptions:
    """The optional members `stage` defines, the others at their declared defaults."""
    mine = vars(stage)
    return StageOptions(**{f.name: mine[f.name] for f in fields(StageOptions) if f.name in mine})
