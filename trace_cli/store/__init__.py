"""Store: artifacts on disk, manifests, content-derived ids and the derived DuckDB index, behind the `Store`
facade (store/facade.py)."""

from trace_cli.store.artifacts import Artifact, ArtifactWriter, file_input
from trace_cli.store.facade import Store

__all__ = ["Artifact", "ArtifactWriter", "Store", "file_input"]
