"""Stage commands' options come from their config schemas: every one takes --config and --set, every bound option's
default and help are the schema's, and the layers stack as schema default < --config < flags < --set."""

from __future__ import annotations

import json
import re

import click
import pytest
import yaml
from trace_testing import episode, run_cli, write_jsonl

from trace_cli.cli import cli
from trace_cli.cli.options import ConfigOption
from trace_cli.config.schemas import load_schema
from trace_cli.stages import STAGES

# every command that runs a stage, and the stage
STAGE_COMMANDS = {
    ("ingest", "tau2"): "ingest",
    ("ingest", "jsonl"): "ingest",
    ("model", "init"): "model",
    ("model", "import"): "model",
    ("model", "pretrain"): "pretrain",
    ("eval",): "eval",
    ("diagnose",): "diagnose",
    ("synthesize",): "synthesize",
    ("train",): "train",
    ("compose",): "compose",
}
# a misspelt key per stage command, and the key it should suggest
TYPOS = {
    ("ingest", "tau2"): ("on_eror", "on_error"),
    ("ingest", "jsonl"): ("sourec", "source"),
    ("model", "init"): ("corpus_seed", "corpus_seeds"),
    ("model", "import"): ("chat_templat", "chat_template"),
    ("model", "pretrain"): ("max_stesp", "max_steps"),
    ("eval",): ("trails", "trials"),
    ("diagnose",): ("min_run", "min_runs"),
    ("synthesize",): ("max_turn", "max_turns"),
    ("train",): ("max_step", "max_steps"),
    ("compose",): ("adapterz", "adapters"),
}
CONFIG_DECLS = {"--config", "--set"}


def _command(path: tuple[str, ...]) -> click.Command:
    ctx = click.Context(cli, info_name="trace")
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, path
        ctx = click.Context(cmd, info_name=name, parent=ctx)
    return cmd


def _node(schema: dict, key: str) -> dict:
    node = schema
    for part in key.split("."):
        node = node["properties"][part]
    return node


def test_every_stage_has_a_command():
    assert set(STAGE_COMMANDS.values()) == set(STAGES)
    assert set(TYPOS) == set(STAGE_COMMANDS)


@pytest.mark.parametrize("path", list(STAGE_COMMANDS), ids=" ".join)
def test_stage_command_options_come_from_the_schema(path):
    cmd = _command(path)
    schema = load_schema(f"config/{STAGE_COMMANDS[path]}.v1.json")
    decls = {d for p in cmd.params for d in getattr(p, "opts", [])}
    assert CONFIG_DECLS <= decls, f"`trace {' '.join(path)}` lacks {CONFIG_DECLS - decls}"
    bound = [p for p in cmd.params if isinstance(p, ConfigOption)]
    assert bound, path
    for opt in bound:
        node = _node(schema, opt.config_key)
        where = f"`trace {' '.join(path)} {opt.opts[0]}` ({opt.config_key})"
        expected = node.get("default", node.get("x-cli-default"))
        default = list(opt.default) if opt.multiple else opt.default
        if expected is None:
            assert default in (None, [], False), f"{where}: default {default!r} is not in the schema"
        else:
            assert default == expected, f"{where}: default {default!r}, schema {expected!r}"
            assert opt.show_default, where
        if opt.is_flag:
            assert node.get("type") == "boolean", where
        desc = node.get("description") or ""
        if not desc and "$ref" in node:  # env: the description is the referenced definition's
            desc = load_schema("config/eval.v1.json")["$defs"]["env_ref"]["description"]
        assert desc, f"{where}: the schema has no description to be its help"
        assert opt.help.startswith(desc.rstrip(".")[:40]), f"{where}: help {opt.help!r} is not the schema's"
        # the help never restates the default: --help shows the schema's [default: ...]
        assert not re.search(r"\(default:? [\d\[]", opt.help), f"{where}: {opt.help!r}"
        if expected not in (None, False, [], {}):
            assert f"default {expected}" not in opt.help and f"default: {expected}" not in opt.help, where
        if isinstance(node.get("enum"), list):
            assert list(opt.type.choices) == [e for e in node["enum"] if e is not None], where


@pytest.mark.parametrize("path", list(STAGE_COMMANDS), ids=" ".join)
def test_unknown_keys_exit_2_with_did_you_mean(path, tmp_path):
    typo, key = TYPOS[path]
    store = tmp_path / "store"
    r = run_cli(*path, "--set", f"{typo}=1", "--store", store)
    assert r.exit_code == 2, r.output
    assert f"{typo}: unknown key; did you mean '{key}'?" in r.stderr, r.stderr
    assert "--set: " in r.stderr
    f = tmp_path / "cfg.yaml"
    f.write_text(f"{typo}: 1\n")
    r = run_cli(*path, "--config", f, "--store", store)
    assert r.exit_code == 2, r.output
    assert f"{f}: " in r.stderr and f"{typo}: unknown key; did you mean '{key}'?" in r.stderr, r.stderr
    assert not store.exists(), "nothing may be written before the config is valid"


def test_a_required_key_is_named_by_its_flag(tmp_path):
    r = run_cli("eval", "--env", "shop", "--store", tmp_path / "s")
    assert r.exit_code == 2 and "--model is required (or set model in --config)" in r.stderr
    r = run_cli("ingest", "jsonl", "--store", tmp_path / "s")
    assert r.exit_code == 2 and "FILE is required (or set path in --config)" in r.stderr
    f = tmp_path / "c.yaml"
    f.write_text("env: shop\nmodle: policy:reference\n")
    r = run_cli("eval", "--config", f, "--store", tmp_path / "s")
    assert r.exit_code == 2
    assert "modle: unknown key; did you mean 'model'?" in r.stderr
    assert "--model is required (or set model in --config)" in r.stderr
    f.write_text("- env: shop\n")
    r = run_cli("eval", "--config", f, "--store", tmp_path / "s")
    assert r.exit_code == 2 and f"{f}: expected a mapping of eval config keys" in r.stderr


def _manifest(store, kind: str, aid: str) -> dict:
    return yaml.safe_load((store / kind / aid / "manifest.yaml").read_text())


def test_eval_layers_schema_config_flags_set(tmp_path):
    store = tmp_path / "store"
    f = tmp_path / "eval.yaml"
    f.write_text(
        "kind: eval\nmodel: policy:reference\nenv: shop\nseeds: '0:3'\ntrials: 2\nmax_turns: 5\nbatch_size: 4\n"
    )
    args = ("eval", "--config", f, "--trials", "1", "--max-turns", "6", "--set", "max_turns=7")
    r = run_cli(*args, "--store", store, "--json")
    assert r.exit_code == 0, r.output
    assert "override max_turns: 6 -> 7" in r.stderr
    aid = json.loads(r.stdout)["eval"].rsplit("/", 1)[1]
    m = _manifest(store, "eval", aid)
    cfg = m["config"]
    assert cfg["seeds"] == "0:3" and cfg["batch_size"] == 4  # the file
    assert cfg["trials"] == 1  # a flag over the file
    assert cfg["max_turns"] == 7  # --set over the flag
    assert cfg["temperature"] == 0.0 and cfg["max_new_tokens"] == 160  # the schema's defaults
    assert m["overrides"] == [{"key": "max_turns", "old": 6, "new": 7}]
    # the same config as flags alone (defaults left out or spelt out) is the same artifact
    for extra in ((), ("--temperature", "0.0", "--seed", "0")):
        r = run_cli(
            "eval", "--model", "policy:reference", "--env", "shop", "--seeds", "0:3", "--trials", "1",
            "--max-turns", "7", "--batch-size", "4", *extra, "--store", store, "--json",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["eval"].endswith(aid) and out["skipped"] is True


def test_ingest_layers_and_a_config_that_names_the_file(tmp_path):
    store = tmp_path / "store"
    data = write_jsonl(tmp_path / "e.jsonl", [episode("e1"), episode("e2", reward=0.0)])
    f = tmp_path / "ingest.yaml"
    f.write_text(f"path: {data}\non_error: skip\nsource: from-file\n")
    r = run_cli("ingest", "jsonl", "--config", f, "--store", store, "--json")  # FILE from the config
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    cfg = _manifest(store, "rollouts", first["id"])["config"]
    assert (cfg["on_error"], cfg["source"], cfg["format"]) == ("skip", "from-file", "jsonl")
    r = run_cli(
        "ingest", "jsonl", data, "--config", f, "--source", "from-flag", "--set", "on_error=fail",
        "--store", store, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    second = json.loads(r.stdout)
    assert second["id"] != first["id"] and second["kind"] == "rollouts"
    cfg = _manifest(store, "rollouts", second["id"])["config"]
    assert (cfg["on_error"], cfg["source"]) == ("fail", "from-flag")
    r = run_cli("ingest", "jsonl", data, "--source", "from-flag", "--store", store, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == {**second, "skipped": True}
