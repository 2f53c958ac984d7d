"""Stage `pretrain`: copy pretraining of a (small, from-scratch) model -> a `model` artifact.

The curriculum and why it is needed are in `trace_cli.training.pretrain`. The artifact's summary reports the
held-out exact-copy probe (`copy_accuracy`) and its trajectory; `pretrain_metrics` (view) holds every step.
"""

from __future__ import annotations

import sys
from typing import Any

from trace_cli.errors import CheckFailed, UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import PRETRAIN_METRICS

NAME = "pretrain"
OUTPUTS = {"model": "model"}


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.corpus import check_envs
    from trace_cli.models.refs import resolve_model

    cfg = checked_config(NAME, config)
    check_envs(cfg["envs"])
    model = resolve_model(cfg["model"], store)
    if model.kind != "hf":
        raise UsageError(
            f"model {cfg['model']!r}: pretraining needs a model (store://model/NAME or an HF dir)"
        )
    id_config = {**cfg, "model": model.digest}
    p = Prepared(NAME, cfg, id_config, [model.as_input("model")], dict(OUTPUTS)).finalize()
    p.extra["model"] = model
    return p


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.envs.corpus import corpus_episodes
    from trace_cli.models.builder import corpus
    from trace_cli.models.refs import load_hf
    from trace_cli.training.pretrain import pretrain_copy

    cfg = prepared.config
    model, tok = load_hf(prepared.extra["model"])
    texts = corpus(corpus_episodes(cfg["envs"], cfg["corpus_seeds"], cfg["seed"]))

    def log(m: dict[str, Any]) -> None:
        if m["step"] % 25 == 0 or "copy_accuracy" in m:
            probe = f"  copy {m['copy_accuracy']:.2f}" if "copy_accuracy" in m else ""
            print(f"step {m['step']:>5}  loss {m['loss']:.4f}{probe}  {m['elapsed_s']:.0f}s", file=sys.stderr)

    keys = ("max_steps", "batch_size", "transcript_share", "seq_len", "target", "probe_every", "probe_size")
    settings = {k: cfg[k] for k in (*keys, "seed", "max_minutes")}
    out = pretrain_copy(model, tok, texts, lr=cfg["learning_rate"], log=log, **settings)
    if cfg["require_target"] and not out["reached_target"]:
        raise CheckFailed(
            f"pretrain: the copy probe reached {out['copy_accuracy']:.2f} after {out['steps']} steps "
            f"(target {cfg['target']}); nothing was written",
            hint="raise max_steps (induction appears abruptly after a plateau), or set require_target: false",
        )
    with prepared.writer(store, "model", name=name, overrides=overrides, replace=replace) as w:
        model.save_pretrained(w.path / "hf")
        tok.save_pretrained(w.path / "hf")
        # rows without a probe get a null copy_accuracy
        PRETRAIN_METRICS.write(out["metrics"], w.path)
        w.summary.update(
            {
                "method": "pretrain",
                "base_model": cfg["model"],
                "copy_accuracy": out["copy_accuracy"],
                "probes": out["probes"],
                "steps": out["steps"],
                "copy_vocabulary": out["copy_vocabulary"],
                "train_s": round(out["minutes"] * 60, 1),
                "parameters": sum(p.numel() for p in model.parameters()),
            }
        )
    return {"model": w.artifact}
