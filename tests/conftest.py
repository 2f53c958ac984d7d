"""Shared fixtures: the real τ²-bench data, tmp stores, a quiet environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Helper modules in tests/ (trace_testing, fixture_stages) import as top-level modules.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from trace_testing import TAU2_DIR, TAU2_FILES  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    monkeypatch.setenv("TRACE_NO_PROGRESS", "1")
    monkeypatch.delenv("TRACE_STORE", raising=False)
    monkeypatch.delenv("TRACE_VERBOSE", raising=False)


@pytest.fixture(scope="session")
def tau2_dir() -> Path:
    missing = [f for f in TAU2_FILES.values() if not (TAU2_DIR / f).is_file()]
    assert not missing, f"vendored τ²-bench data missing from {TAU2_DIR}: {missing}"
    return TAU2_DIR


@pytest.fixture
def store(tmp_path) -> Path:
    """A store directory that does not exist yet."""
    return tmp_path / "store"
