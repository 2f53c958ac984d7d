"""The τ²-bench block of `trace serve --help`, as benchmarks/tau2_cli_check.py runs it: two servers and one
`tau2 run` whose LiteLLM args are valid JSON pointing at them (no key in the args)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_help_block_runs_two_servers_and_one_tau2_command():
    from tau2_cli_check import help_block

    serves, run = help_block("smol", (18400, 18401))
    assert serves == [
        "trace serve store://model/smol --port 18400",
        "trace serve store://model/smol --port 18401",
    ]
    argv = shlex.split(run)
    assert argv[:2] == ["tau2", "run"]
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert opts["--domain"] == "retail"
    assert opts["--agent-llm"] == opts["--user-llm"] == "openai/smol"
    agent, user = json.loads(opts["--agent-llm-args"]), json.loads(opts["--user-llm-args"])
    assert agent == {"api_base": "http://127.0.0.1:18400/v1", "temperature": 0.0}
    assert user == {"api_base": "http://127.0.0.1:18401/v1", "temperature": 0.0}
