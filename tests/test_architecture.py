"""The package's import layering (ARCHITECTURE.md, "Layers"): every import of `trace_cli.X` points to the importer's own package
or to a lower layer, and no modules import each other in a circle.

Imports are read with `ast`, so nothing is imported: absolute and relative imports, also those inside functions
(a lazy import is still a dependency); only `if TYPE_CHECKING:` blocks are skipped (annotations, never run).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import trace_cli

PKG = Path(trace_cli.__file__).parent

# The layer map, top to bottom; packages in one tuple share a layer (see test_imports_point_down). The floor
# holds the modules every layer may use.
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("serve", "report"),
    ("recipes",),
    ("stages",),
    ("training", "compose"),
    ("agents",),
    ("envs", "formats"),
    ("analysts",),
    ("llm", "models"),
    ("store", "config"),
    ("errors", "progress", "catalog", "schemas", "__init__"),
]
RANK = {pkg: len(LAYERS) - i for i, layer in enumerate(LAYERS) for pkg in layer}


def modules() -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of trace_cli."""
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(("trace_cli", *parts)), path


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, module: str, *, type_checking: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported trace_cli module or name) for every import in the file; those under `if TYPE_CHECKING:`
    too when `type_checking`."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]

    def visit(node: ast.AST) -> Iterator[tuple[int, str]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from trace_cli.store import index` imports the module trace_cli.store.index; `from
            # trace_cli.store import Store` a name of the package trace_cli.store (see resolve)
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            children = node.orelse
        else:
            children = list(ast.iter_child_nodes(node))
        for child in children:
            yield from visit(child)

    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for lineno, name in visit(tree):
        if name == "trace_cli" or name.startswith("trace_cli."):
            yield lineno, name


def resolve(name: str, known: set[str]) -> str:
    """The module an imported name lives in: itself when it is a module, else the module that defines it."""
    return name if name in known or "." not in name else name.rpartition(".")[0]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_is_in_the_layer_map():
    top = {package_of(m) for m, _ in modules()}
    assert top <= set(RANK), f"packages missing from LAYERS: {sorted(top - set(RANK))}"


def test_imports_point_down():
    """Up is never allowed. Peers of one layer (llm and models, store and config, ...) may use one another in
    one direction only: which one is the lower is then fixed by the code, and no two packages lean on each
    other."""
    known = {m for m, _ in modules()}
    upward = []
    sideways: dict[tuple[str, str], str] = {}
    for module, path in modules():
        mine = package_of(module)
        for lineno, name in imports(path, module):
            target = resolve(name, known)
            theirs = package_of(target)
            where = f"{path.relative_to(PKG.parent)}:{lineno} ({mine}) imports {target} ({theirs})"
            if theirs == mine or RANK[theirs] < RANK[mine]:
                continue
            if RANK[theirs] > RANK[mine]:
                upward.append(where)
            else:
                sideways.setdefault((mine, theirs), where)
    both = [f"{w} and {sideways[(b, a)]}" for (a, b), w in sorted(sideways.items()) if (b, a) in sideways]
    assert not upward, "imports that point up in the layer map:\n" + "\n".join(sorted(set(upward)))
    assert not both, "peers of one layer that import each other:\n" + "\n".join(both)


def _graph(*, type_checking: bool = False) -> dict[str, dict[str, tuple[Path, int]]]:
    """module -> {imported module: (file, line)}: every import, lazy ones too (a function-level import that
    closes a circle only hides it until that function runs); with `type_checking`, annotation-only ones too."""
    known = {m for m, _ in modules()}
    graph: dict[str, dict[str, tuple[Path, int]]] = {}
    for module, path in modules():
        edges = graph.setdefault(module, {})
        for lineno, name in imports(path, module, type_checking=type_checking):
            target = resolve(name, known)
            if target in known and target != module:
                edges.setdefault(target, (path, lineno))
    return graph


def _cycles(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


@pytest.mark.parametrize("type_checking", [False, True], ids=["run-time", "with-annotations"])
def test_no_import_circles(type_checking):
    """No circle anywhere in trace_cli/, also counting `if TYPE_CHECKING:` imports: a module that names its
    importer's type still leans on it (a type checker, a reader and tools such as dependency graphs see a
    circle), so the lower module names the lower type (e.g. store/maintenance.py takes `Artifacts`)."""
    graph = _graph(type_checking=type_checking)
    lines = []
    for comp in _cycles(graph):
        members = set(comp)
        edges = [
            f"  {path.relative_to(PKG.parent)}:{line} imports {w}"
            for v in comp
            for w, (path, line) in sorted(graph[v].items())
            if w in members
        ]
        lines.append(f"circle among {', '.join(comp)}:\n" + "\n".join(edges))
    assert not lines, "\n".join(lines)


def test_the_scanner_sees_lazy_relative_and_type_checking_imports(tmp_path):
    """The checks above are only as good as the scan: it finds imports inside functions and relative ones,
    and skips `if TYPE_CHECKING:` blocks."""
    pkg = tmp_path / "trace_cli" / "store"
    pkg.mkdir(parents=True)
    f = pkg / "x.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import layout\n"
        "if TYPE_CHECKING:\n"
        "    from trace_cli.stages import base\n"
        "def f():\n"
        "    from ..models import refs\n"
        "    import trace_cli.cli\n"
    )
    found = set(imports(f, "trace_cli.store.x"))
    assert (2, "trace_cli.store.layout") in found
    assert (6, "trace_cli.models.refs") in found
    assert (7, "trace_cli.cli") in found
    assert not any("stages" in name for _, name in found)


def test_the_circle_check_sees_a_circle_closed_by_an_annotation_import(tmp_path, monkeypatch):
    """A circle whose one edge is an `if TYPE_CHECKING:` import is found by the strict graph only."""
    pkg = tmp_path / "trace_cli"
    (pkg / "store").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "a.py").write_text("def f():\n    from trace_cli.store import b\n")
    (pkg / "store" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trace_cli.store.a import f\n"
    )
    monkeypatch.setitem(globals(), "PKG", pkg)
    assert _cycles(_graph()) == []
    assert _cycles(_graph(type_checking=True)) == [["trace_cli.store.a", "trace_cli.store.b"]]


@functools.cache
def _run_time_graph(pkg: Path) -> dict[str, dict[str, tuple[Path, int]]]:
    """`_graph()` of the package at `pkg`, read once for the parametrized folder checks."""
    return _graph()


def _sibling_graph(package: str) -> dict[str, dict[str, str]]:
    """The direct children (modules and sub-packages) of `package` -> {child they import: where}, every module
    of a sub-package counted as the sub-package: a folder that leans on a sibling that leans back is a circle
    even when no two modules form one."""
    depth = package.count(".") + 1
    graph: dict[str, dict[str, str]] = {}
    for module, targets in _run_time_graph(PKG).items():
        if not module.startswith(package + ".") or module.count(".") < depth:
            continue
        mine = ".".join(module.split(".")[: depth + 1])
        edges = graph.setdefault(mine, {})
        for target, (path, line) in targets.items():
            if target.startswith(package + ".") and target.count(".") >= depth:
                theirs = ".".join(target.split(".")[: depth + 1])
                if theirs != mine:
                    edges.setdefault(theirs, f"{path.relative_to(PKG.parent)}:{line}")
    return graph


def packages() -> list[str]:
    """trace_cli and each of its packages, at every depth."""
    return sorted({m.rpartition(".")[0] for m, p in modules() if p.name != "__init__.py"} | {"trace_cli"})


# Folder circles known and being removed. An entry that no longer closes a circle fails the test below, so the
# list can only shrink. (The last one, envs.sandbox <-> envs.synthetic, went when the LLM author moved up from
# envs.synthetic to envs.authoring, above both: the sandbox runs synthetic's checks, authoring drives the sandbox.)
PENDING_FOLDER_CIRCLES: set[tuple[str, str]] = set()


@pytest.mark.parametrize("package", [p for p in packages() if p != "trace_cli"])
def test_no_circles_between_the_folders_of_a_package(package):
    """Inside every package, its sub-packages and modules import each other in one direction only (lazy imports
    included): e.g. envs.artifact, which envs.synthetic's authoring writes with, must not load envs.synthetic."""
    graph = _sibling_graph(package)
    lines, pending = [], []
    for comp in _cycles({k: dict.fromkeys(v) for k, v in graph.items()}):
        if tuple(comp) in PENDING_FOLDER_CIRCLES:
            pending.append(tuple(comp))
            continue
        edges = [f"  {graph[v][w]}: {v} imports {w}" for v in comp for w in sorted(graph[v]) if w in comp]
        lines.append(f"circle among {', '.join(comp)}:\n" + "\n".join(edges))
    assert not lines, "\n".join(lines)
    stale = {c for c in PENDING_FOLDER_CIRCLES if c[0].rpartition(".")[0] == package} - set(pending)
    assert not stale, f"no longer a circle, remove from PENDING_FOLDER_CIRCLES: {sorted(stale)}"


def test_the_folder_check_sees_a_circle_between_two_sub_packages(tmp_path, monkeypatch):
    """Two sub-packages whose modules lean on each other (no module circle) are a folder circle."""
    pkg = tmp_path / "trace_cli"
    for sub in ("envs", "envs/a", "envs/b"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "a" / "x.py").write_text("def f():\n    from trace_cli.envs.b import y\n")
    (pkg / "envs" / "b" / "y.py").write_text("")
    (pkg / "envs" / "b" / "z.py").write_text("from trace_cli.envs.a import w\n")
    (pkg / "envs" / "a" / "w.py").write_text("")
    monkeypatch.setitem(globals(), "PKG", pkg)
    assert _cycles(_graph()) == []
    graph = _sibling_graph("trace_cli.envs")
    assert _cycles({k: dict.fromkeys(v) for k, v in graph.items()}) == [
        ["trace_cli.envs.a", "trace_cli.envs.b"]
    ]


def test_templates_reach_a_world_only_through_the_seam():
    """The capability templates (envs.synthetic) import no world (envs.shop, envs.tau2): they see the target's world
    through envs.worlds only, so a new world is a new module, not edits across the templates."""
    bad = [
        f"{path.relative_to(PKG.parent)}:{lineno} imports {name}"
        for module, path in modules()
        if module.startswith("trace_cli.envs.synthetic")
        for lineno, name in imports(path, module, type_checking=True)
        if name.startswith(("trace_cli.envs.shop", "trace_cli.envs.tau2"))
    ]
    assert not bad, "\n".join(bad)
