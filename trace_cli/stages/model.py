"""Stage `model`: build an offline Qwen3-architecture model + tokenizer as a `model` artifact."""

from __future__ import annotations

from typing import Any

from trace_cli.errors import UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store

NAME = "model"
OUTPUTS = {"model": "model"}


def check_envs(names: list[str]) -> None:
    """`envs:` must name registered environments (model and pretrain render their transcripts)."""
    from trace_cli.envs.registry import list_envs

    known = list_envs()
    bad = [e for e in names if e not in known]
    if bad:
        raise UsageError(f"envs: unknown environment(s) {', '.join(bad)}; registered: {', '.join(known)}")


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    check_envs(cfg["envs"])
    # The id covers what the config builds, not only what it says: the preset's resolved architecture and
    # vocabulary (presets are code and can change) and the builder's version.
    from trace_cli.models.builder import BUILDER_VERSION, PRESETS

    resolved = {**PRESETS[cfg["preset"]], **(cfg.get("arch") or {})}
    resolved["vocab_size"] = cfg.get("vocab_size") or resolved["vocab_size"]
    id_config = {**cfg, "resolved": resolved, "builder_version": BUILDER_VERSION}
    return Prepared(NAME, cfg, id_config, [], dict(OUTPUTS)).finalize()


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.models.builder import build

    cfg = prepared.config
    with store.writer(
        "model",
        NAME,
        cfg,
        [],
        name=name,
        overrides=overrides,
        seed=cfg["seed"],
        id=prepared.id,
        replace=replace,
    ) as w:
        summary = build(
            w.path / "hf",
            preset=cfg["preset"],
            seed=cfg["seed"],
            envs=cfg["envs"],
            corpus_seeds=cfg["corpus_seeds"],
            vocab_size=cfg.get("vocab_size"),
            arch=cfg.get("arch"),
        )
        w.summary.update(summary)
    return {"model": w.artifact}
