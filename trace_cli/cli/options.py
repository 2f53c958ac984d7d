"""A stage command's options, generated from its config schema, and the config it hands the stage.

`schemas/config/<stage>.v1.json` is the one place a config key's type, choices, default and meaning are
written: a `Flag` names a key, and its click option takes everything else from the schema (the help from
`description`, the default from `default`, shown by --help). Every stage command also takes `--config FILE`
and `--set KEY=VALUE`. Layers, lowest first: the schema's defaults (filled in by the stage) < the --config
file < flags given on the command line < --set. A flag left at its default adds nothing, so a config file's
value is never overwritten by a default the user did not type, and leaving a flag out and giving its default
give the same config (and the same artifact id).

The file's and --set's mistakes are reported before anything runs, all at once, each unknown key with a
did-you-mean; then a required key that no layer gave is named by its flag.

One schema annotation is read here only: `x-cli-default`, a value the command supplies when no layer gives
the key, for keys that must not have a config default (`model init --preset`: a model config names either
a preset or a source, so the schema cannot default either).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource

from trace_cli.cli.common import info, json_option, open_store, store_option
from trace_cli.config.schemas import SCHEMA_BASE, load_schema

_NOT_GIVEN = (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)
_SCALARS = {"integer": int, "number": float, "string": str}


def schema_node(schema: dict[str, Any], key: str) -> dict[str, Any]:
    """The schema of a dotted config key (`calibration.seeds`), with a `$ref` resolved (its own `default` and
    `description`, beside the `$ref`, win over the target's)."""
    node: dict[str, Any] = schema
    for part in key.split("."):
        props = node.get("properties") or {}
        if part not in props:
            raise KeyError(f"{schema.get('$id', 'schema')}: no config key {key!r}")
        node = _deref(props[part], schema)
    return node


def _deref(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    url, _, pointer = ref.partition("#")
    target: Any = load_schema(url.removeprefix(SCHEMA_BASE)) if url else schema
    for part in pointer.strip("/").split("/") if pointer.strip("/") else []:
        target = target[part]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _kind(node: dict[str, Any]) -> str | None:
    t = node.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t


def _help(node: dict[str, Any], note: str, multiple: bool) -> str:
    text = (node.get("description") or "").strip().rstrip(".")
    if multiple:
        text = f"{text[:-1]}; repeatable)" if text.endswith(")") else f"{text} (repeatable)"
    text = f"{text}." if text else ""
    return f"{text} {note}".strip()


class ConfigOption(click.Option):
    """A click option bound to a config key (`config_key`); tests walk commands by it."""

    def __init__(self, *args, config_key: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.config_key = config_key


@dataclass(frozen=True)
class Flag:
    """`--max-turns` for the key `max_turns`; `key` when the name differs or the key is nested."""

    decl: str
    key: str | None = None
    multiple: bool | None = None  # default: the schema's type is an array
    note: str = ""  # command-line syntax the schema cannot say (e.g. EXPERT=ROLLOUTS)
    metavar: str | None = None
    convert: Callable[[Any], Any] | None = None  # the flag's value -> the config's

    @property
    def config_key(self) -> str:
        return self.key or self.decl.lstrip("-").replace("-", "_")

    @property
    def dest(self) -> str:
        return self.decl.lstrip("-").replace("-", "_")

    @property
    def label(self) -> str:
        return self.decl

    def decorator(self, schema: dict[str, Any]):
        node = schema_node(schema, self.config_key)
        kind = _kind(node)
        multiple = self.multiple if self.multiple is not None else kind == "array"
        item = node.get("items", {}) if kind == "array" else node
        kw: dict[str, Any] = {"help": _help(node, self.note, multiple), "metavar": self.metavar}
        enum = [e for e in item.get("enum") or () if e is not None]  # null: the flag left out
        if enum and all(isinstance(e, str) for e in enum):
            kw["type"] = click.Choice(enum)
        elif kind == "boolean":
            kw["is_flag"] = True
        else:
            kw["type"] = _SCALARS.get(_kind(item) or "string", str)
        default = node.get("default", node.get("x-cli-default"))
        if multiple:
            kw["multiple"] = True
            default = tuple(default) if isinstance(default, list) else ()
        kw["default"] = default
        if default is not None:
            kw["show_default"] = True
        return click.option(self.decl, self.dest, cls=ConfigOption, config_key=self.config_key, **kw)

    def value(self, raw: Any) -> Any:
        if isinstance(raw, tuple):
            raw = list(raw)
        if self.convert is None:
            return raw
        return [self.convert(v) for v in raw] if isinstance(raw, list) else self.convert(raw)


@dataclass(frozen=True)
class Arg:
    """A positional argument (`FILE`) for a config key (`path`); optional when --config gives the key."""

    name: str
    key: str
    type: Any = None

    config_key = property(lambda self: self.key)
    dest = property(lambda self: self.name)
    label = property(lambda self: self.name.upper())

    def decorator(self, schema: dict[str, Any]):
        schema_node(schema, self.key)  # the key must exist
        return click.argument(self.name, type=self.type, required=False)

    def value(self, raw: Any) -> Any:
        return raw


@dataclass
class Layers:
    """A command's config before the stage checks it: the merged layers, the --set record, and where the
    layers came from (the file, '--set', or None when only flags were given)."""

    config: dict[str, Any]
    applied: list[dict[str, Any]]
    source: str | None


class StageOptions:
    """The options of one stage's command, bound to the keys of `schemas/config/<stage>.v1.json`."""

    def __init__(self, stage: str, *params: str | Flag | Arg):
        self.stage = stage
        self.schema = load_schema(f"config/{stage}.v1.json")
        self.params = tuple(Flag(p) if isinstance(p, str) else p for p in params)

    def command(
        self,
        name: str | None = None,
        *,
        epilog: str,
        outputs: tuple[str, str],
        group=click,
        fixed: dict[str, Any] | None = None,
        run: bool = True,
    ):
        """A stage command: `group.command(name)` with these options, then --name/--force (`outputs`: their
        help), --json and --store. With `run`, the command runs the stage (its config from the layers, plus
        `fixed`) and its function only reports: `f(out, as_json)` with the stage's Outcome. Without, the
        function takes `name, force, as_json, store_dir, **flags` and calls `execute` itself."""

        def decorate(f):
            if run:
                report = f

                @functools.wraps(report)
                def f(name, force, as_json, store_dir, **flags):
                    out = self.execute(flags, name=name, force=force, store_dir=store_dir, fixed=fixed)
                    return report(out, as_json)

            return group.command(name, epilog=epilog)(self(output_options(*outputs)(f)))

        return decorate

    def default(self, key: str) -> Any:
        """The schema's default of a (dotted) key, for help text that explains a rule by its numbers."""
        return schema_node(self.schema, key)["default"]

    def __call__(self, f):
        decorators = [p.decorator(self.schema) for p in self.params]
        decorators.append(
            click.option(
                "--config",
                "config_file",
                type=click.Path(dir_okay=False),
                help=f"YAML config (kind: {self.stage}); keys: schemas/config/{self.stage}.v1.json.",
            )
        )
        decorators.append(
            click.option(
                "--set",
                "overrides",
                multiple=True,
                metavar="KEY=VALUE",
                help="Override a config key, after --config and the flags (repeatable; a.b=1 for nested keys).",
            )
        )
        for d in reversed(decorators):
            f = d(f)
        return f

    def merge(self, values: dict[str, Any], *, fixed: dict[str, Any] | None = None, announce: bool = True):
        """Pop this command's config flags out of `values` (the command's keyword arguments) and layer them."""
        from trace_cli.config.layers import layer

        ctx = click.get_current_context()
        file, overrides = values.pop("config_file", None), values.pop("overrides", ())
        flags: dict[str, Any] = {}
        for p in self.params:
            raw = values.pop(p.dest)
            if isinstance(p, Arg) and raw is None:
                continue
            if ctx.get_parameter_source(p.dest) not in _NOT_GIVEN:
                flags[p.config_key] = p.value(raw)
        flags.update(fixed or {})
        cfg, applied = layer(self.stage, file=file, flags=flags, overrides=list(overrides))
        for key, default in self._cli_defaults():  # top-level keys only (model's preset)
            cfg.setdefault(key, default)
        if announce:
            for a in applied:
                info(f"override {a['key']}: {a['old']!r} -> {a['new']!r}")
        return Layers(cfg, applied, file or ("--set" if overrides else None))

    def check(self, layers: Layers, *, later: tuple[str, ...] = ()) -> None:
        """The --config file's and --set's mistakes first, every one with its key (not a secondary "--model
        is required" when the file spells it `modle`); then a required key no layer gave, by its flag. Keys in
        `later` are required by the stage but filled in by the command (synthesize: one capability a run)."""
        from trace_cli.config.layers import get_path, present
        from trace_cli.config.schemas import validate
        from trace_cli.errors import UsageError, ValidationError
        from trace_cli.stages import config_schema

        cfg = layers.config
        required = set(self.schema.get("required", [])) - set(later)
        missing = [p for p in self.params if p.config_key in required and get_path(cfg, p.config_key) is None]
        if layers.source:
            schema, doc = config_schema(self.stage), present(cfg)
            if later:
                schema = {**schema, "required": [k for k in schema.get("required", []) if k not in later]}
                doc = {k: v for k, v in doc.items() if k not in later}
            try:
                validate(doc, schema, source=layers.source)
            except ValidationError as e:
                also = "".join(f"\n{_required(p)}" for p in missing)
                raise UsageError(e.message + also) from e
        if missing:
            raise UsageError(_required(missing[0]))

    def config(self, values: dict[str, Any], *, fixed: dict[str, Any] | None = None, announce: bool = True):
        """`merge` then `check`: the config and the --set record to hand `execute`."""
        layers = self.merge(values, fixed=fixed, announce=announce)
        self.check(layers)
        return layers.config, layers.applied

    def execute(self, values: dict[str, Any], *, name, force, store_dir, fixed=None, announce: bool = True):
        """The command's config (`config`), run by the stage in the --store store: the stage's Outcome."""
        from trace_cli.stages.base import execute

        cfg, applied = self.config(values, fixed=fixed, announce=announce)
        return execute(self.stage, cfg, open_store(store_dir), name=name, overrides=applied, force=force)

    def _cli_defaults(self):
        for p in self.params:
            node = schema_node(self.schema, p.config_key)
            if "x-cli-default" in node:
                yield p.config_key, node["x-cli-default"]


def _required(p: Flag | Arg) -> str:
    return f"{p.label} is required (or set {p.config_key} in --config)"


def output_options(name_help: str, force_help: str):
    """--name, --force, --json and --store: what every stage command's output takes."""

    def decorate(f):
        f = json_option(store_option(f))
        f = click.option("--force", is_flag=True, help=force_help)(f)
        return click.option("--name", help=name_help)(f)

    return decorate
