"""Run a recipe: steps in dependency order, each skipped when its config and input digests are unchanged."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.errors import TraceError, UsageError
from trace_cli.recipes.model import REF_RE, Recipe, Step
from trace_cli.store import Store


@dataclass
class StepReport:
    id: str
    uses: str
    status: str  # ran | skipped (up to date) | resolved (not selected, existing output used) | would run | pending | error
    outputs: dict[str, str] = field(default_factory=dict)  # output name -> store:// URI
    artifact_id: str | None = None
    seconds: float = 0.0
    detail: str = ""


def _substitute(value: Any, outputs: dict[str, dict[str, str]]) -> Any:
    if isinstance(value, str):
        return REF_RE.sub(lambda m: outputs[m.group(1)][m.group(2)], value)
    if isinstance(value, dict):
        return {k: _substitute(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, outputs) for v in value]
    return value


def _resolve_paths(step: Step, config: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative file paths in a step are relative to the recipe file, not to the current directory."""
    from trace_cli.stages import get_stage

    out = dict(config)
    for key in getattr(get_stage(step.uses), "PATH_KEYS", ()):
        v = out.get(key)
        if isinstance(v, str) and v and not v.startswith("store://") and not Path(v).is_absolute():
            if "/" not in v and not (base / v).exists():
                continue  # a bare name that is no file next to the recipe (e.g. a built-in model source)
            out[key] = str((base / v).resolve())
    return out


def _selection(recipe: Recipe, from_: str | None, to: str | None) -> set[str]:
    selected = {s.id for s in recipe.steps}
    if from_:
        recipe.step(from_)
        selected &= {from_} | recipe.descendants(from_)
    if to:
        recipe.step(to)
        selected &= {to} | recipe.ancestors(to)
    return selected


def step_config(recipe: Recipe, step: Step, outputs: dict[str, dict[str, str]]) -> dict[str, Any]:
    return _resolve_paths(step, _substitute(step.with_, outputs), recipe.path.parent)


def run_recipe(
    recipe: Recipe,
    store: Store,
    *,
    force: bool = False,
    from_: str | None = None,
    to: str | None = None,
    echo: Callable[[str], None] = lambda s: None,
) -> list[StepReport]:
    from trace_cli.stages import get_stage
    from trace_cli.stages.base import execute

    selected = _selection(recipe, from_, to)
    for o in recipe.applied_overrides:
        echo(f"override {o['key']}: {o['old']!r} -> {o['new']!r}")
    outputs: dict[str, dict[str, str]] = {}
    reports: list[StepReport] = []
    order = recipe.topo_order()
    needed = set(selected)
    for sid in selected:
        needed |= recipe.ancestors(sid)
    for step in order:
        if step.id not in needed:
            continue
        cfg = step_config(recipe, step, outputs)
        t0 = time.monotonic()
        if step.id not in selected:
            prepared = get_stage(step.uses).prepare(cfg, store)
            found = prepared.existing(store)
            if found is None:
                raise UsageError(
                    f"step {step.id!r} is outside --from/--to but has no up-to-date output; "
                    f"run it first (trace run {recipe.path} --to {step.id})"
                )
            outputs[step.id] = {k: a.uri for k, a in found.items()}
            reports.append(StepReport(step.id, step.uses, "resolved", outputs[step.id], prepared.id))
            echo(f"[{step.id}] not selected; using {next(iter(found.values())).uri}")
            continue
        echo(f"[{step.id}] {step.uses} ...")
        try:
            out = execute(step.uses, cfg, store, name=step.name, overrides=step.overrides, force=force)
        except TraceError as e:
            e.message = f"step {step.id!r} ({step.uses}): {e.message}"
            e.args = (e.message,)
            raise
        outputs[step.id] = {k: a.uri for k, a in out.outputs.items()}
        status = "skipped" if out.skipped else "ran"
        rep = StepReport(step.id, step.uses, status, outputs[step.id], out.prepared.id, time.monotonic() - t0)
        reports.append(rep)
        if out.skipped:
            echo(f"[{step.id}] up to date, skipped ({out.main.uri})")
        else:
            echo(f"[{step.id}] done in {rep.seconds:.1f}s -> {out.main.uri}")
    return reports


def recipe_status(recipe: Recipe, store: Store) -> list[StepReport]:
    """What `trace run` would do, without running anything."""
    from trace_cli.stages import get_stage

    outputs: dict[str, dict[str, str]] = {}
    state: dict[str, str] = {}
    reports = []
    for step in recipe.topo_order():
        blocked = [d for d in step.deps if state.get(d) != "up to date"]
        if blocked:
            state[step.id] = "pending"
            reports.append(StepReport(step.id, step.uses, "pending", detail=f"after {', '.join(blocked)}"))
            continue
        try:
            prepared = get_stage(step.uses).prepare(step_config(recipe, step, outputs), store)
        except TraceError as e:
            state[step.id] = "error"
            reports.append(StepReport(step.id, step.uses, "error", detail=e.message.splitlines()[0]))
            continue
        found = prepared.existing(store)
        if found is None:
            state[step.id] = "would run"
            reports.append(StepReport(step.id, step.uses, "would run", artifact_id=prepared.id))
        else:
            state[step.id] = "up to date"
            outputs[step.id] = {k: a.uri for k, a in found.items()}
            reports.append(StepReport(step.id, step.uses, "up to date", outputs[step.id], prepared.id))
    return reports
