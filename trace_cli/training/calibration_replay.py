"""A GRPO run's first steps taken from the environment's calibration: synthesize keeps the admitted attempt's
episodes as token sequences when a model calibrated with GRPO's sampler (`reuse_calibration`), and train replays
them as whole groups instead of generating new rollouts, when they were sampled as the run would sample."""

from __future__ import annotations

from typing import Any

from trace_cli.config.sampling import SamplingSettings
from trace_cli.errors import UsageError
from trace_cli.store import Store


def calibration_replay(
    cfg, ref, store: Store, world: int, per_step: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The calibration episodes the first `reuse_calibration` steps take instead of new rollouts (whole groups of
    num_generations episodes of one seed, `per_step` episodes a step, as many as those steps use), and why none
    are when none are."""
    from trace_cli.envs.artifact import read_calibration_rollouts
    from trace_cli.errors import NotFoundError

    n_steps = cfg["reuse_calibration"]
    if not n_steps:
        return [], None
    try:
        art = store.resolve(cfg["env"], kind="environment") if isinstance(cfg["env"], str) else None
    except (NotFoundError, UsageError):
        art = None
    if art is None:
        return [], "env is not a synthesized environment artifact"
    meta = art.summary.get("calibration_rollouts")
    if not meta:
        return (
            [],
            f"{art.uri} kept no calibration rollouts (calibrated by a policy, or before they were kept)",
        )
    want = SamplingSettings.of(cfg).reuse_key(ref.digest)
    other = [f"{k} {meta.get(k)!r} (here {v!r})" for k, v in want.items() if meta.get(k) != v]
    if cfg["top_k"]:
        other.append(f"top_k {cfg['top_k']} (calibration samples without)")
    if other:
        return [], f"{art.uri} was calibrated with other settings: {', '.join(other)}"
    if world > 1:
        return [], "several processes (each would take the same episodes)"
    g = cfg["num_generations"]
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in read_calibration_rollouts(art):
        by_seed.setdefault(r["seed"], []).append(r)
    groups = [eps[i : i + g] for eps in by_seed.values() for i in range(0, len(eps) - g + 1, g)]
    episodes = [e for grp in groups for e in grp]
    usable = min(n_steps, len(episodes) // per_step) * per_step
    if not usable:
        return [], f"{len(episodes)} calibration episodes in groups of {g}: fewer than one step's {per_step}"
    return episodes[:usable], None
