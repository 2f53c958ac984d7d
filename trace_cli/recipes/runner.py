"""Run a recipe: steps in dependency order, each skipped when its config and input digests are unchanged.

A step that fans out (one artifact per capability, recipes.model) runs, skips and reports each artifact on
its own, as ID[KEY] (named NAME-KEY); its outputs are lists of URIs, in the order the stage gave them.
"""

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
    id: str  # the step's id; ID[KEY] for each artifact of a step that fans out
    uses: str
    status: str  # ran | skipped (up to date) | resolved (not selected, existing output used) | would run | pending | error
    outputs: dict[str, str] = field(default_factory=dict)  # output name -> store:// URI
    artifact_id: str | None = None
    seconds: float = 0.0
    detail: str = ""


Outputs = dict[str, dict[str, Any]]  # step id -> output name -> URI (a list of URIs if the step fans out)


def _substitute(value: Any, outputs: Outputs) -> Any:
    """References replaced by the URIs they name; a whole-value reference to a list becomes the list."""
    if isinstance(value, str):
        whole = REF_RE.fullmatch(value)
        if whole:
            return outputs[whole.group(1)][whole.group(2)]
        return REF_RE.sub(lambda m: _text(outputs[m.group(1)][m.group(2)], m.group(0)), value)
    if isinstance(value, dict):
        return {k: _substitute(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, outputs) for v in value]
    return value


def _text(uri: Any, ref: str) -> str:
    if not isinstance(uri, str):  # load_recipe refuses this before anything runs
        raise UsageError(f"{ref} is a list; use it as a whole value")
    return uri


def _resolve_paths(step: Step, config: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative file paths in a step are relative to the recipe file, not to the current directory."""
    from trace_cli.stages import get_stage
    from trace_cli.stages.contract import stage_options

    out = dict(config)
    for key in stage_options(get_stage(step.uses)).PATH_KEYS:
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


def step_config(recipe: Recipe, step: Step, outputs: Outputs) -> dict[str, Any]:
    return _resolve_paths(step, _substitute(step.with_, outputs), recipe.path.parent)


def _label(step: Step, key: str | None) -> str:
    return step.id if key is None else f"{step.id}[{key}]"


def _uris(step: Step, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The step's outputs (one dict of artifacts per member) as URIs: lists when it fans out."""
    if not step.fans_out:
        return {k: a.uri for k, a in outputs[0].items()}
    return {k: [o[k].uri for o in outputs] for k in outputs[0]}


def _found(step: Step, config: dict[str, Any], store: Store) -> list[tuple[str | None, Any, Any]]:
    """(key, Prepared, existing outputs or None) for each artifact of the step, nothing run."""
    from trace_cli.stages.base import fan_out, prepare

    out = []
    for key, cfg in fan_out(step.uses, config, store):
        p = prepare(step.uses, cfg, store)
        out.append((key, p, p.existing(store)))
    return out


def run_recipe(
    recipe: Recipe,
    store: Store,
    *,
    force: bool = False,
    from_: str | None = None,
    to: str | None = None,
    echo: Callable[[str], None] = lambda s: None,
) -> list[StepReport]:
    selected = _selection(recipe, from_, to)
    for o in recipe.applied_overrides:
        echo(f"override {o['key']}: {o['old']!r} -> {o['new']!r}")
    outputs: Outputs = {}
    reports: list[StepReport] = []
    order = recipe.topo_order()
    needed = set(selected)
    for sid in selected:
        needed |= recipe.ancestors(sid)
    for step in order:
        if step.id not in needed:
            continue
        cfg = step_config(recipe, step, outputs)
        if step.id not in selected:
            found = _found(step, cfg, store)
            if any(f is None for _, _, f in found):
                raise UsageError(
                    f"step {step.id!r} is outside --from/--to but has no up-to-date output; "
                    f"run it first (trace run {recipe.path} --to {step.id})"
                )
            outputs[step.id] = _uris(step, [f for _, _, f in found])
            for key, p, f in found:
                uris = {k: a.uri for k, a in f.items()}
                reports.append(StepReport(_label(step, key), step.uses, "resolved", uris, p.id))
                echo(f"[{_label(step, key)}] not selected; using {next(iter(f.values())).uri}")
            continue
        echo(f"[{step.id}] {step.uses} ...")
        try:
            members = _run_step(step, cfg, store, force, reports, echo)
        except TraceError as e:
            e.message = f"step {step.id!r} ({step.uses}): {e.message}"
            e.args = (e.message,)
            raise
        outputs[step.id] = _uris(step, [m.outcome.outputs for m in members])
    return reports


def _run_step(step: Step, cfg: dict[str, Any], store: Store, force: bool, reports: list, echo) -> list:
    """Execute each artifact of the step (one, or one per key), reporting each; raise if any failed."""
    from trace_cli.stages.base import execute_each, failed

    members = []
    t0 = time.monotonic()
    for m in execute_each(step.uses, cfg, store, name=step.name, overrides=step.overrides, force=force):
        members.append(m)
        label = _label(step, m.key)
        if m.failure is not None:
            echo(f"[{label}] failed: {m.failure.message}")
            continue
        out = m.outcome
        uris = {k: a.uri for k, a in out.outputs.items()}
        status = "skipped" if out.skipped else "ran"
        rep = StepReport(label, step.uses, status, uris, out.prepared.id, time.monotonic() - t0)
        reports.append(rep)
        if out.skipped:
            echo(f"[{label}] up to date, skipped ({out.main.uri})")
        else:
            echo(f"[{label}] done in {rep.seconds:.1f}s -> {out.main.uri}")
        t0 = time.monotonic()
    err = failed(step.uses, members)
    if err is not None:
        raise err
    return members


def recipe_status(recipe: Recipe, store: Store) -> list[StepReport]:
    """What `trace run` would do, without running anything: a row per artifact (ID[KEY] when a step fans
    out, once the inputs that decide its keys exist)."""
    outputs: Outputs = {}
    state: dict[str, str] = {}
    reports = []
    for step in recipe.topo_order():
        blocked = [d for d in step.deps if state.get(d) != "up to date"]
        if blocked:
            state[step.id] = "pending"
            reports.append(StepReport(step.id, step.uses, "pending", detail=f"after {', '.join(blocked)}"))
            continue
        try:
            found = _found(step, step_config(recipe, step, outputs), store)
        except TraceError as e:
            state[step.id] = "error"
            reports.append(StepReport(step.id, step.uses, "error", detail=e.message.splitlines()[0]))
            continue
        for key, p, f in found:
            if f is None:
                reports.append(StepReport(_label(step, key), step.uses, "would run", artifact_id=p.id))
            else:
                uris = {k: a.uri for k, a in f.items()}
                reports.append(StepReport(_label(step, key), step.uses, "up to date", uris, p.id))
        if all(f is not None for _, _, f in found):
            state[step.id] = "up to date"
            outputs[step.id] = _uris(step, [f for _, _, f in found])
        else:
            state[step.id] = "would run"
    return reports
