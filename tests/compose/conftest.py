"""Compose test fixtures (defined in compose_helpers, shared with tests/stages/test_compose.py)."""

from compose_helpers import composed_store, tiny  # noqa: F401
