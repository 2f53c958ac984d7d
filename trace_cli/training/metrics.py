"""GRPO metrics: one `train_metrics` row per optimizer step from the Trainer's log history, the rollouts each
step cost, and the adapter summary's learning numbers.

The columns are the table's (store/tables.py GRPO_METRICS): every float column is the TRL log key of the same
name, except where TRL names it otherwise (TRL_KEYS); `episodes` and `rollouts` are counted here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from trace_cli.store.tables import GRPO_METRICS

# column -> TRL log key, where the two differ
# (completion_length: the model's tokens per episode, logged by the reward function: TRL's own length metric
# counts the loss mask, which is zero for the constant-reward groups kept out of the loss)
TRL_KEYS = {"completion_length": "model_tokens", "clipped_ratio": "completions/clipped_ratio"}
METRIC_COLUMNS: list[tuple[str, str]] = [  # (parquet column, TRL log key)
    (name, TRL_KEYS.get(name, name)) for name, kind in GRPO_METRICS.fields if kind == "float64"
]
SUMMARY_STEPS = 5  # reward/success "first" and "last" average this many steps


def rollouts_after(spec, steps: int) -> int:
    """Episodes generated to reach optimizer step `steps` of a run with `spec` (a GRPOSpec): one generation
    batch of `spec.episodes_per_step` every `num_iterations` steps (TRL reuses a batch for num_iterations
    optimizer steps)."""
    return math.ceil(steps / spec.num_iterations) * spec.episodes_per_step


def metrics_rows(history: list[dict[str, Any]], rollouts_at: Callable[[int], int]) -> list[dict[str, Any]]:
    """One row per optimizer step from the Trainer's log history (restored from the checkpoint on resume)."""
    rows: dict[int, dict[str, Any]] = {}
    for h in history:
        if "reward" not in h or "step" not in h:
            continue
        row: dict[str, Any] = {"step": int(h["step"])}
        for col, key in METRIC_COLUMNS:
            v = h.get(key)
            row[col] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            if row[col] is not None and math.isnan(row[col]):
                row[col] = None
        rows[row["step"]] = row
    out = [rows[k] for k in sorted(rows)]
    for r in out:
        r["rollouts"] = rollouts_at(r["step"])
        r["episodes"] = r["rollouts"] - rollouts_at(r["step"] - 1)
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def learning_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rollouts, episodes per step, reward and success over the first and the last steps, and the mean share
    of constant-reward groups (which carry no signal)."""
    n = min(SUMMARY_STEPS, len(rows))
    head, tail = rows[:n], rows[len(rows) - n :]
    return {
        "rollouts": rows[-1]["rollouts"] if rows else 0,
        "episodes_per_step": rows[0]["episodes"] if rows else None,
        "reward_first": _mean(head, "reward"),
        "reward_last": _mean(tail, "reward"),
        "success_first": _mean(head, "success"),
        "success_last": _mean(tail, "success"),
        "frac_constant_groups": _mean(rows, "frac_reward_zero_std"),
    }


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def progress_line(logs: dict[str, Any], max_steps: int) -> str:
    """The stderr line of one optimizer step, from the Trainer's log dict (TRL keys)."""
    return (
        f"step {logs['step']:>4}/{max_steps}  reward {_fmt(logs.get('reward'))} ± {_fmt(logs.get('reward_std'))}"
        f"  success {_fmt(logs.get('success'), '.2f')}  const groups {_fmt(logs.get('frac_reward_zero_std'), '.2f')}"
        f"  len {_fmt(logs.get('model_tokens'), '.0f')}  lr {_fmt(logs.get('learning_rate'), '.1e')}"
    )
