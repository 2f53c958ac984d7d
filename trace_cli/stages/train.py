"""Stage `train`: `method: sft` fine-tunes a model on environment demonstrations -> a `model` artifact.

Deficits withhold named behaviours from the demonstrations, so the demo's base agent fails where we
decided it would; the capabilities it lacks are then what `diagnose` has to find.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_cli.errors import UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import TableSpec, register_table

NAME = "train"
OUTPUTS = {"model": "model"}
METRICS_FILE = "train_metrics.parquet"
METRICS_SCHEMA = pa.schema([
    ("step", pa.int64()), ("loss", pa.float64()), ("grad_norm", pa.float64()), ("lr", pa.float64()),
    ("tokens", pa.int64()), ("elapsed_s", pa.float64()),
])
register_table(TableSpec("sft_metrics", "model", METRICS_FILE, METRICS_SCHEMA))


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.envs.refs import env_identity
    from trace_cli.envs.registry import make_env
    from trace_cli.models.refs import resolve_model
    from trace_cli.stages.eval import parse_seeds

    cfg = checked_config(NAME, config)
    seeds = parse_seeds(cfg["seeds"])
    env = make_env(cfg["env"], store=store)
    if cfg["deficits"]:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            raise UsageError(f"env {cfg['env']!r} cannot build demonstrations with deficits")
        env.reset(seeds[0])
        demo(set(cfg["deficits"]))  # raises UsageError naming an unknown deficit
    model = resolve_model(cfg["model"], store)
    if model.kind != "hf":
        raise UsageError(f"--model {cfg['model']!r}: SFT starts from a model (store://model/NAME or an HF dir), "
                         f"not a {model.kind}")
    env_id = env_identity(cfg["env"], store=store)
    id_config = {**cfg, "model": model.digest, "env": env_id["id"]}
    p = Prepared(NAME, cfg, id_config, [model.as_input("model")] + env_id["inputs"], dict(OUTPUTS)).finalize()
    p.extra.update(model=model, seeds=seeds)
    return p


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    import sys

    from trace_cli.models.refs import load_hf
    from trace_cli.training.sft import demonstrations, tokenize, train_sft

    cfg = prepared.config
    model, tok = load_hf(prepared.extra["model"])
    lora = cfg.get("lora") or {}
    if lora.get("enabled"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                                 target_modules=lora["target_modules"], task_type="CAUSAL_LM"))
    demos = demonstrations(cfg["env"], prepared.extra["seeds"], set(cfg["deficits"]), store)
    examples = tokenize(tok, demos, cfg["max_length"])
    if not examples:
        raise UsageError(f"no demonstration fits max_length={cfg['max_length']}; raise it")

    def log(m: dict[str, Any]) -> None:
        if m["step"] % 10 == 0:
            print(f"step {m['step']:>5}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  {m['elapsed_s']:.0f}s", file=sys.stderr)

    metrics = train_sft(model, tok, examples, epochs=cfg["epochs"], lr=cfg["learning_rate"],
                        batch_size=cfg["batch_size"], seed=cfg["seed"], max_minutes=cfg["max_minutes"], log=log)
    if lora.get("enabled"):
        model = model.merge_and_unload()
    with store.writer("model", NAME, cfg, prepared.inputs, name=name, overrides=overrides, seed=cfg["seed"],
                      id=prepared.id, replace=replace) as w:
        model.save_pretrained(w.path / "hf")
        tok.save_pretrained(w.path / "hf")
        pq.write_table(pa.Table.from_pylist(metrics, schema=METRICS_SCHEMA), w.path / METRICS_FILE)
        last = metrics[-10:]
        w.summary.update({
            "method": "sft", "base_model": cfg["model"], "deficits": cfg["deficits"], "demonstrations": len(examples),
            "steps": len(metrics), "final_loss": sum(m["loss"] for m in last) / max(1, len(last)),
            "train_s": round(metrics[-1]["elapsed_s"], 1) if metrics else 0.0,
            "parameters": sum(p.numel() for p in model.parameters()),
        })
    return {"model": w.artifact}
