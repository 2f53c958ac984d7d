"""Recipe model: load + validate (schema, each step's `with` against its stage, references, cycles).

A step whose stage fans out (stages.base.fans_out: synthesize without one capability, GRPO on a list of
environments) makes one artifact per capability, so its outputs are lists. Which steps do is known from their
`with` alone, in dependency order (a list output makes the next step's input a list), so a reference to a
list is validated as one: the whole value of a key that takes a list (`adapters`, a train step's `env`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.config.loading import apply_overrides, load_document
from trace_cli.config.schemas import validate
from trace_cli.errors import UsageError, ValidationError

REF_RE = re.compile(r"\$\{\s*steps\.([A-Za-z_][A-Za-z0-9_-]*)\.outputs\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")
ANY_REF_RE = re.compile(r"\$\{[^}]*\}")


@dataclass
class Step:
    id: str
    uses: str
    with_: dict[str, Any]
    name: str | None
    index: int
    overrides: list[dict[str, Any]] = field(default_factory=list)
    fans_out: bool = False  # one artifact per capability: its outputs are lists

    def refs(self) -> list[tuple[str, str, str]]:
        """(yaml path, step id, output name) for every ${steps.ID.outputs.NAME} in `with`."""
        out: list[tuple[str, str, str]] = []

        def walk(v: Any, path: str) -> None:
            if isinstance(v, str):
                for m in REF_RE.finditer(v):
                    out.append((path, m.group(1), m.group(2)))
            elif isinstance(v, dict):
                for k, x in v.items():
                    walk(x, f"{path}.{k}")
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    walk(x, f"{path}[{i}]")

        walk(self.with_, f"steps[{self.index}].with")
        return out

    @property
    def deps(self) -> list[str]:
        seen: list[str] = []
        for _, sid, _ in self.refs():
            if sid not in seen:
                seen.append(sid)
        return seen


@dataclass
class Recipe:
    path: Path
    steps: list[Step]
    applied_overrides: list[dict[str, Any]]

    def step(self, sid: str) -> Step:
        for s in self.steps:
            if s.id == sid:
                return s
        raise UsageError(
            f"{self.path}: no step with id {sid!r}; steps are: {', '.join(s.id for s in self.steps)}"
        )

    def topo_order(self) -> list[Step]:
        """Dependencies first; ties keep file order (reordering the file never changes what runs). Kahn's
        algorithm with a heap on the file index: O(n log n) in steps."""
        import heapq

        by_id = {s.id: s for s in self.steps}
        indeg = {s.id: 0 for s in self.steps}
        children: dict[str, list[str]] = {s.id: [] for s in self.steps}
        for s in self.steps:
            for d in s.deps:
                if d in by_id and d != s.id:
                    indeg[s.id] += 1
                    children[d].append(s.id)
        ready = [(s.index, s.id) for s in self.steps if indeg[s.id] == 0]
        heapq.heapify(ready)
        order: list[Step] = []
        while ready:
            _, sid = heapq.heappop(ready)
            order.append(by_id[sid])
            for c in children[sid]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, (by_id[c].index, c))
        if len(order) != len(self.steps):  # pragma: no cover - cycles are rejected at load time
            raise UsageError("cycle in recipe")
        return order

    def ancestors(self, sid: str) -> set[str]:
        by_id = {s.id: s for s in self.steps}
        if sid not in by_id:
            self.step(sid)  # raises with the list of step ids
        out: set[str] = set()
        stack = [sid]
        while stack:
            for d in by_id[stack.pop()].deps:
                if d not in out and d in by_id:
                    out.add(d)
                    stack.append(d)
        return out

    def descendants(self, sid: str) -> set[str]:
        children: dict[str, list[str]] = {}
        for s in self.steps:
            for d in s.deps:
                children.setdefault(d, []).append(s.id)
        out: set[str] = set()
        stack = [sid]
        while stack:
            for c in children.get(stack.pop(), []):
                if c not in out:
                    out.add(c)
                    stack.append(c)
        return out


def _by_id(doc: dict[str, Any]) -> dict[str, Any]:
    """Steps keyed by id, so `--set steps.ID.with.key=value` addresses a step by its id."""
    out = dict(doc)
    out["steps"] = {s["id"]: s for s in doc["steps"]}
    return out


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load and fully validate a recipe; raise ValidationError with every problem found."""
    from trace_cli.stages import STAGES, get_stage

    p = Path(path)
    doc = load_document(p)
    if doc is None:
        raise UsageError(f"{p}: the recipe file is empty")
    errors: list[str] = []
    try:
        validate(doc, "recipe.v1.json", source=str(p))
    except ValidationError as ve:
        if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
            raise
        errors += ve.errors  # keep going: the well-formed steps are checked too, so every error shows at once
    raw = _well_formed_steps(doc["steps"], errors)
    all_ids = {s.get("id") for s in doc["steps"] if isinstance(s, dict)}  # a malformed step still exists
    applied: list[dict[str, Any]] = []
    if overrides and not errors:  # overrides address steps by id, which needs a well-formed recipe
        doc, applied = _override(doc, [s["id"] for _, s in raw], overrides, p)
        raw = list(enumerate(doc["steps"]))
    steps = []
    for i, s in raw:
        step = Step(s["id"], s["uses"], dict(s.get("with") or {}), s.get("name"), i)
        step.overrides = [a for a in applied if a["key"].split(".")[1].split("[")[0] == step.id]
        steps.append(step)
    outputs_of = {t.id: get_stage(t.uses).OUTPUTS for t in steps if t.uses in STAGES}
    recipe = Recipe(p, steps, applied)
    cycle = _find_cycle(steps)
    unique = len({t.id for t in steps}) == len(steps)
    fanning = _mark_fan_out(recipe) if unique and not cycle else set()
    uses_of = {t.id: t.uses for t in steps}
    for s in steps:
        errors += _step_errors(s, fanning, all_ids, outputs_of, uses_of)
    if cycle:
        errors.append("cycle: " + " -> ".join(cycle))
    if errors:
        raise ValidationError(errors, source=f"{p} (after --set)" if applied else str(p))
    return recipe


def _well_formed_steps(steps: list[Any], errors: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(file index, step) for steps well-formed enough to check their `with`, references and cycles; a duplicate
    id is an error."""
    raw = [
        (i, s)
        for i, s in enumerate(steps)
        if isinstance(s, dict)
        and isinstance(s.get("id"), str)
        and isinstance(s.get("uses"), str)
        and isinstance(s.get("with") or {}, dict)
    ]
    first: dict[str, int] = {}
    for i, s in raw:
        if s["id"] in first:
            errors.append(f"steps[{i}].id: duplicate step id {s['id']!r} (also steps[{first[s['id']]}])")
        else:
            first[s["id"]] = i
    return raw


def _override(
    doc: dict[str, Any], ids: list[str], overrides: list[str], p: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The recipe with `--set steps.STEP_ID.with.KEY=VALUE` applied (validated again), and what was applied."""
    for o in overrides:
        if not o.split("=", 1)[0].startswith("steps."):
            raise UsageError(f"--set {o!r}: recipe overrides look like steps.STEP_ID.with.KEY=VALUE")
        key = o.split("=", 1)[0]
        sid = key.split(".")[1].split("[")[0]
        if sid not in ids:
            raise UsageError(f"--set {o!r}: no step with id {sid!r}; steps are: {', '.join(ids)}")
    by_id, applied = apply_overrides(_by_id(doc), overrides)
    doc = dict(by_id)
    doc["steps"] = [by_id["steps"][sid] for sid in ids]
    validate(doc, "recipe.v1.json", source=f"{p} (after --set)")
    return doc, applied


def _step_errors(
    s: Step, fanning: set[str], all_ids: set[Any], outputs_of: dict[str, Any], uses_of: dict[str, str]
) -> list[str]:
    """One step's problems: an unknown stage, a `with` its stage's schema refuses, bad output references."""
    from trace_cli.stages import STAGES, config_schema

    if s.uses not in STAGES:
        return [
            f"steps[{s.index}].uses: unknown stage {s.uses!r}; expected one of: {', '.join(sorted(STAGES))}"
        ]
    errors: list[str] = []
    view = _with_lists(s.with_, fanning, f"steps[{s.index}].with", errors)
    try:
        validate(view, config_schema(s.uses))
    except ValidationError as ve:
        errors += [
            f"steps[{s.index}].with" + ("" if e.startswith("<root>") else ".") + e.removeprefix("<root>")
            for e in ve.errors
        ]
    for path_, sid, out in s.refs():
        if sid not in all_ids:
            errors.append(f"{path_}: dangling reference ${{steps.{sid}.outputs.{out}}}: no step {sid!r}")
        elif sid == s.id:
            errors.append(f"{path_}: step {s.id!r} refers to its own output")
        elif sid in outputs_of and out not in outputs_of[sid]:
            errors.append(
                f"{path_}: step {sid!r} ({uses_of[sid]}) has no output {out!r}; outputs: {', '.join(outputs_of[sid])}"
            )
    return errors + _unparsable_refs(s.with_, f"steps[{s.index}].with")


def _mark_fan_out(recipe: Recipe) -> set[str]:
    """Mark the steps that fan out, upstream first (a list input can make a step fan out); their ids."""
    from trace_cli.stages import STAGES
    from trace_cli.stages.base import fans_out

    fanning: set[str] = set()
    for s in recipe.topo_order():
        if s.uses in STAGES and fans_out(s.uses, _with_lists(s.with_, fanning, "", [])):
            s.fans_out = True
            fanning.add(s.id)
    return fanning


def _with_lists(v: Any, fanning: set[str], path_: str, errors: list[str]) -> Any:
    """`v` as the stage will see it, as far as known before running: a whole-value reference to a step that fans
    out becomes a list (of the reference, so a schema error shows it); such a reference inside a longer
    string is an error (appended to `errors`)."""
    if isinstance(v, dict):
        return {k: _with_lists(x, fanning, f"{path_}.{k}", errors) for k, x in v.items()}
    if isinstance(v, list):
        return [_with_lists(x, fanning, f"{path_}[{j}]", errors) for j, x in enumerate(v)]
    if not isinstance(v, str):
        return v
    whole = REF_RE.fullmatch(v)
    if whole and whole.group(1) in fanning:
        return [v]
    for m in REF_RE.finditer(v):
        if m.group(1) in fanning:
            errors.append(
                f"{path_}: {m.group(0)} is a list (step {m.group(1)!r} makes one artifact per capability); "
                "use it as a whole value"
            )
    return v


def _unparsable_refs(v: Any, path_: str) -> list[str]:
    """`${...}` strings that are not `${steps.ID.outputs.NAME}` (typos would otherwise pass as literals)."""
    out: list[str] = []
    if isinstance(v, str):
        for m in ANY_REF_RE.finditer(v):
            if not REF_RE.fullmatch(m.group(0)):
                out.append(f"{path_}: cannot parse reference {m.group(0)!r}; use ${{steps.ID.outputs.NAME}}")
    elif isinstance(v, dict):
        for k, x in v.items():
            out += _unparsable_refs(x, f"{path_}.{k}")
    elif isinstance(v, list):
        for j, x in enumerate(v):
            out += _unparsable_refs(x, f"{path_}[{j}]")
    return out


def _find_cycle(steps: list[Step]) -> list[str] | None:
    ids = {s.id for s in steps}
    graph = {s.id: [d for d in s.deps if d in ids and d != s.id] for s in steps}
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in graph[n]:
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                c = dfs(d)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for s in steps:
        if s.id not in state:
            c = dfs(s.id)
            if c:
                return c
    return None
