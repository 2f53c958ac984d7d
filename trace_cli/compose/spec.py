"""The composition document (`composition.yaml`, schemas/composition.v1.json) and the expert facts it records:
capability name and description of each adapter, taken from the adapter, environment and diagnosis artifacts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trace_cli.compose import COMPOSITION_FILE
from trace_cli.errors import UsageError

EXPERTS_DIR = "experts"


@dataclass
class ExpertInfo:
    name: str  # the capability: slot / label name
    description: str
    adapter_uri: str
    adapter_id: str
    adapter_digest: str
    env: Any
    adapter_dir: Path


def _catalog() -> dict[str, str]:
    from importlib import resources

    try:
        doc = yaml.safe_load(
            (resources.files("trace_cli") / "catalog" / "capabilities.yaml").read_text("utf-8")
        )
    except (OSError, yaml.YAMLError):
        return {}
    return {c["name"]: " ".join(str(c.get("description", "")).split()) for c in doc.get("capabilities", [])}


def describe(capability: str, env_ref: Any, store) -> str:
    """The capability's description: its environment artifact, else the diagnosis it came from, else the
    built-in catalogue, else the name in words."""
    if isinstance(env_ref, str) and env_ref.startswith("store://environment/"):
        from trace_cli.envs.artifact import read_environment

        try:
            doc = read_environment(store.resolve(env_ref, kind="environment"))
        except Exception:  # noqa: BLE001 - a gone environment only costs the description
            doc = {}
        if doc.get("description"):
            return " ".join(str(doc["description"]).split())
        if doc.get("diagnosis"):
            try:
                diag = store.resolve(doc["diagnosis"], kind="diagnosis")
                caps = yaml.safe_load((diag.path / "capabilities.yaml").read_text(encoding="utf-8")) or {}
                for c in caps.get("selected", []):
                    if c.get("name") == capability and c.get("description"):
                        return " ".join(str(c["description"]).split())
            except Exception:  # noqa: BLE001
                pass
    cat = _catalog().get(capability)
    return cat or f"The {capability.replace('_', ' ')} capability."


def read_composition(path: Path) -> dict[str, Any]:
    from trace_cli.config.schemas import validate

    f = Path(path) / COMPOSITION_FILE
    if not f.is_file():
        raise UsageError(f"{path}: not a composition artifact (no {COMPOSITION_FILE})")
    doc = yaml.safe_load(f.read_text(encoding="utf-8"))
    validate(doc, "composition.v1.json", source=str(f))
    return doc


def write_composition(path: Path, doc: dict[str, Any]) -> None:
    from trace_cli.config.schemas import validate

    validate(doc, "composition.v1.json", source=COMPOSITION_FILE)
    (Path(path) / COMPOSITION_FILE).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
