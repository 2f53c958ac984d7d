"""Analyst test fixtures (defined in analyst_helpers, which the test modules also import by name: a module
called `conftest` would clash with the other test folders' conftest files on sys.path)."""

from analyst_helpers import ep, episodes, llm_server  # noqa: F401
