"""A test-only stage `count_episodes` (rollouts -> an `eval` artifact with counts), to give recipes a dependency.

Registered per test through `trace_cli.stages.STAGES`; its config schema is the module's CONFIG_SCHEMA.
"""

from __future__ import annotations

import json
from typing import Any

from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.rollouts import read_episodes

NAME = "count_episodes"
OUTPUTS = {"report": "eval"}
CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["rollouts"],
    "properties": {
        "kind": {"const": NAME},
        "rollouts": {"type": "string", "minLength": 1},
        "label": {"type": "string", "default": "all"},
        "min_reward": {"type": "number", "default": 1.0},
    },
}


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    art = store.resolve(cfg["rollouts"], kind="rollouts")
    return Prepared(
        NAME, cfg, cfg, [art.as_input("rollouts")], dict(OUTPUTS), extra={"rollouts": art}
    ).finalize()


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    eps = read_episodes(prepared.extra["rollouts"].path)
    n_ok = sum(1 for e in eps if e["reward"] >= prepared.config["min_reward"])
    with store.writer(
        "eval",
        NAME,
        prepared.config,
        prepared.inputs,
        name=name,
        overrides=overrides,
        id=prepared.id,
        replace=replace,
    ) as w:
        (w.path / "report.json").write_text(json.dumps({"episodes": len(eps), "at_least_min_reward": n_ok}))
        w.summary.update(
            {"episodes": len(eps), "at_least_min_reward": n_ok, "label": prepared.config["label"]}
        )
    return {"report": w.artifact}
