"""Stage `model`: build an offline Qwen3-architecture model + tokenizer (`preset`), or import a real checkpoint
(`source`: HF dir, .gguf, built-in smollm2-135m-instruct), as a `model` artifact.

The environments' episodes that the model layer needs (the tokenizer's corpus, the template check of an
import) are replayed by trace_cli.envs.corpus and handed down: trace_cli.models knows no environment."""

from __future__ import annotations

from typing import Any

from trace_cli.errors import UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store

NAME = "model"
OUTPUTS = {"model": "model"}
# an HF directory or .gguf file, relative to the recipe (built-in names stay as they are)
PATH_KEYS = ("source",)


IMPORT_KEYS = ("source", "chat_template")
PRESET_ONLY = ("preset", "vocab_size", "arch", "corpus_seeds")


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.corpus import check_envs

    raw = dict(config or {})
    if "source" in raw:
        return _prepare_import(raw)
    bad = [k for k in IMPORT_KEYS if k in raw]
    if bad:
        raise UsageError(f"{', '.join(bad)}: only used when importing a model (source: ...)")
    cfg = checked_config(NAME, config)
    check_envs(cfg["envs"])
    # The id covers what the config builds, not only what it says: the preset's resolved architecture and
    # vocabulary (presets are code and can change) and the builder's version.
    from trace_cli.models.builder import BUILDER_VERSION, PRESETS

    resolved = {**PRESETS[cfg["preset"]], **(cfg.get("arch") or {})}
    resolved["vocab_size"] = cfg.get("vocab_size") or resolved["vocab_size"]
    id_config = {**cfg, "resolved": resolved, "builder_version": BUILDER_VERSION}
    return Prepared(NAME, cfg, id_config, [], dict(OUTPUTS)).finalize()


def _prepare_import(raw: dict[str, Any]) -> Prepared:
    from trace_cli.envs.corpus import check_envs
    from trace_cli.models.importer import IMPORTER_VERSION, resolve_source

    bad = [k for k in PRESET_ONLY if k in raw]
    if bad:
        raise UsageError(f"{', '.join(bad)}: only used when building a preset; drop it with source:")
    cfg = checked_config(NAME, raw)
    for k in ("corpus_seeds",):  # preset defaults that mean nothing for an import
        cfg.pop(k, None)
    check_envs(cfg["envs"])
    src = resolve_source(cfg["source"])
    id_config = {**cfg, "source_digest": src["digest"], "importer_version": IMPORTER_VERSION}
    inputs = [{"role": "source", "digest": src["digest"], "path": str(src["path"])}]
    p = Prepared(NAME, cfg, id_config, inputs, dict(OUTPUTS)).finalize()
    p.extra["source"] = src
    return p


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.envs.corpus import corpus_episodes
    from trace_cli.models.builder import build

    cfg = prepared.config
    if "source" in cfg:
        return _run_import(prepared, store, name=name, overrides=overrides, replace=replace)
    with prepared.writer(store, "model", name=name, overrides=overrides, replace=replace) as w:
        summary = build(
            w.path / "hf",
            preset=cfg["preset"],
            seed=cfg["seed"],
            episodes=corpus_episodes(cfg["envs"], cfg["corpus_seeds"], cfg["seed"]),
            vocab_size=cfg.get("vocab_size"),
            arch=cfg.get("arch"),
        )
        w.summary.update(summary)
    return {"model": w.artifact}


def _run_import(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False):
    from trace_cli.envs.corpus import sample_episodes
    from trace_cli.models.importer import import_model

    cfg = prepared.config
    with prepared.writer(store, "model", name=name, overrides=overrides, replace=replace) as w:
        w.summary.update(
            import_model(
                cfg["source"],
                w.path / "hf",
                chat_template=cfg.get("chat_template"),
                episodes=sample_episodes(cfg["envs"]),
            )
        )
    return {"model": w.artifact}
