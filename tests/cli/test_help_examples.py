"""The `run` / `status` help examples name steps the demo recipe has, and their overrides are accepted."""

from __future__ import annotations

import re
import shlex

import yaml
from trace_testing import REPO, run_cli


def _examples(command: str) -> list[list[str]]:
    r = run_cli(command, "--help")
    assert r.exit_code == 0, r.output
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith(f"trace {command} recipes/")]
    assert lines, r.stdout
    return [shlex.split(ln)[1:] for ln in lines]


def test_run_and_status_help_examples_name_the_demo_recipes_steps(tmp_path):
    steps = {s["id"] for s in yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())["steps"]}
    for command in ("run", "status"):
        for args in _examples(command):
            assert args[1] == "recipes/demo.yaml", args
            named = [args[i + 1] for i, a in enumerate(args) if a in ("--from", "--to")]
            named += [m.group(1) for a in args for m in [re.match(r"steps\.([^.]+)\.", a)] if m]
            assert set(named) <= steps, (command, args, sorted(steps))
            # the overrides load: `status` validates the recipe with them (unknown keys exit 2)
            sets = [x for i, a in enumerate(args) if a == "--set" for x in ("--set", args[i + 1])]
            r = run_cli("status", str(REPO / "recipes" / "demo.yaml"), *sets, "--store", str(tmp_path / "s"))
            assert r.exit_code == 0, (args, r.output)
