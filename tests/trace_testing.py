"""Test helpers: paths to the vendored τ²-bench data, in-process/subprocess `trace` runs, store snapshots, JSONL records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The τ²-bench sample files are vendored in the repository (examples/tau2, MIT licence).
TAU2_DIR = REPO / "examples" / "tau2"
TAU2_FILES = {
    "retail": "results_gpt-4.1_retail_test.json",
    "airline": "results_gpt-4.1_airline_test.json",
    "telecom": "results_gpt-4o_telecom_small.json",
}
BIN = Path(sys.executable).parent


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run `trace ARGS` in-process through `trace_cli.cli.main`, so exit codes are mapped as in the console script."""
    from click.testing import CliRunner

    from trace_cli.cli import main

    runner = CliRunner()
    with runner.isolation(env=env) as (out, err, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return Result(code, out.getvalue().decode(), err.getvalue().decode())


def run_benchmark(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """benchmarks/SCRIPT with `args` in a subprocess of this interpreter (stdout and stderr captured)."""
    cmd = [sys.executable, str(REPO / "benchmarks" / script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def short_eval(model: str, store_root, *extra: str) -> Result:
    """`trace eval` of `model` on shop, two seeds of at most two turns and six new tokens each."""
    args = ("--env", "shop", "--seeds", "0:2", "--max-turns", "2", "--max-new-tokens", "6")
    return run_cli("eval", "--model", model, *args, "--store", str(store_root), *extra)


def run_trace(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    """Run the installed `trace` console script in a real subprocess."""
    e = dict(os.environ)
    e["TRACE_NO_PROGRESS"] = "1"
    e.pop("TRACE_STORE", None)
    if env:
        e.update(env)
    exe = BIN / "trace"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]
    return subprocess.run(
        cmd + [str(a) for a in args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout
    )


def snapshot(root: Path) -> list[tuple[str, int, int]]:
    """Every path under a store with size and mtime: equal snapshots = nothing was written or touched."""
    if not root.exists():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out.append((p.relative_to(root).as_posix(), st.st_size if p.is_file() else -1, st.st_mtime_ns))
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def episode(eid: str = "ep-1", task_id: str = "t1", reward: float = 1.0, **extra) -> dict:
    """A valid JSONL episode record: OpenAI chat messages with a tool call (string arguments) and its result."""
    rec = {
        "episode_id": eid,
        "task_id": task_id,
        "reward": reward,
        "messages": [
            {"role": "system", "content": "You are a shop assistant."},
            {"role": "user", "content": "Where is order #12?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"{eid}-c1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"order_id": "#12"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"{eid}-c1", "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": "It has shipped."},
        ],
    }
    rec.update(extra)
    return rec


def make_diagnosis(store, selected, name="diag", rollouts="store://rollouts/none") -> str:
    """A diagnosis artifact that selects `selected` (what synthesize reads), written straight to `store`."""
    import yaml

    from trace_cli.config.schemas import validate

    doc = {
        "kind": "diagnosis",
        "version": 1,
        "rollouts": rollouts,
        "analyst": "rules",
        "thresholds": {"coverage_min": 0.1, "delta_min": 0.2, "runs": 10, "min_runs": 8},
        "episodes": {"failed": 5, "passed": 5},
        "selected": [
            {
                "name": n,
                "description": f"The {n.replace('_', ' ')} capability.",
                "mean_delta": 0.5,
                "std_delta": 0.1,
                "mean_coverage": 0.3,
                "std_coverage": 0.1,
                "runs_passed": 10,
                "runs_total": 10,
                "example_failed_task_ids": ["0", "1"],
            }
            for n in selected
        ],
        "rejected": [],
    }
    validate(doc, "diagnosis.v1.json")
    with store.writer(
        "diagnosis", "diagnose", {"test": list(selected), "rollouts": rollouts}, [], name=name
    ) as w:
        (w.path / "capabilities.yaml").write_text(yaml.safe_dump(doc))
    return f"store://diagnosis/{name}"


def processes_mentioning(text: str) -> list[int]:
    """Live (not zombie) processes, other than this one, whose command line contains `text`."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (p / "stat").read_text().split(") ")[1][0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(p.name))
    return found
