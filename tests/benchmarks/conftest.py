"""What the benchmark tests share: running a script of benchmarks/ in a subprocess, and importing its modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "benchmarks") not in sys.path:  # the scripts' modules (common, se, train_bench, ...)
    sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture
def run_benchmark():
    """run_benchmark("NAME.py", *args, timeout=S): the script run by this Python, its output captured."""

    def run(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(REPO / "benchmarks" / script), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    return run
