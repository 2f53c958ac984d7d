"""Store: artifacts on disk, manifests, content-derived ids and the derived DuckDB index."""

from trace_cli.store.artifacts import Artifact, ArtifactWriter, Store, file_input

__all__ = ["Artifact", "ArtifactWriter", "Store", "file_input"]
