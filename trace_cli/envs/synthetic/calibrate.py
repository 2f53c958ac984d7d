"""Calibration: run the policy on up to N seeds × K rollouts and adjust difficulty until success is in band.

One seed = one GRPO group. A group is "all-0" when no rollout succeeds, "all-1" when every one does; such
groups carry no learning signal for success. In band (TRACE defaults): mean success in [0.2, 0.6], at most
20 % all-0 groups and at most 20 % all-1 groups. Out of band, the environment is made harder (too easy or
too many all-1 groups) or easier, one step at a time, for at most `max_attempts` attempts.

Each attempt is a sequential test (`look` seeds at a time, `look=0`: all N at once): after every look the band
decision is taken if it is clear — every quantity's interval (± z standard errors: group-level for mean
success, Agresti-Coull for the constant-group shares) inside its limits, or one of them wholly outside — and
otherwise the next `look` seeds are run; at N seeds the point estimates decide. An attempt records the seeds it
ran, so what calibration costs (`rollouts_run`) is what ran, in band or not.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_cli.envs.base import Environment


@dataclass
class Attempt:
    attempt: int
    params: dict[str, Any]
    seeds: int
    rollouts: int
    mean_reward: float
    mean_success: float
    frac_all0: float
    frac_all1: float
    frac_constant_reward: float
    in_band: bool
    wall_s: float
    next: str = ""  # "harder", "easier", or why calibration stopped
    decided: str = "all seeds"  # "clear after N seeds" when the sequential test stopped early

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        p = self.params.get("level")
        lv = f"level {p}, " if p is not None else ""
        return (
            f"attempt {self.attempt} ({lv}{self.seeds}x{self.rollouts}, {self.decided}): success {self.mean_success:.3f}, "
            f"reward {self.mean_reward:.3f}, all-0 groups {self.frac_all0:.2f}, all-1 groups {self.frac_all1:.2f}"
            f"{' [in band]' if self.in_band else ''}{f' -> {self.next}' if self.next else ''}"
        )


@dataclass
class Calibration:
    passed: bool
    attempts: list[Attempt]
    params: dict[str, Any]
    results: list[Any] = field(default_factory=list)  # EpisodeResults of the last attempt

    def summary(self) -> str:
        return "\n".join("  " + a.line() for a in self.attempts)

    @property
    def rollouts_run(self) -> int:
        """Every episode calibration generated, over all attempts (what it costs)."""
        return sum(a.seeds * a.rollouts for a in self.attempts)


@dataclass(frozen=True)
class Band:
    low: float = 0.2
    high: float = 0.6
    max_all0: float = 0.2
    max_all1: float = 0.2


def group_stats(results: Sequence[Any]) -> dict[str, float]:
    """Mean reward/success and the fractions of constant groups (a group = the rollouts of one seed)."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for r in results:
        groups[r.seed].append(r)
    n = len(groups) or 1
    all0 = sum(1 for g in groups.values() if not any(r.success for r in g))
    all1 = sum(1 for g in groups.values() if all(r.success for r in g))
    const = sum(1 for g in groups.values() if len({round(r.reward, 9) for r in g}) == 1)
    total = len(results) or 1
    return {
        "mean_reward": sum(r.reward for r in results) / total,
        "mean_success": sum(1 for r in results if r.success) / total,
        "frac_all0": all0 / n,
        "frac_all1": all1 / n,
        "frac_constant_reward": const / n,
    }


def _ac_interval(x: float, n: int, z: float) -> tuple[float, float]:
    """Agresti-Coull interval of a proportion x observed over n trials."""
    nt = n + z * z
    p = (x * n + z * z / 2) / nt
    h = z * (p * (1 - p) / nt) ** 0.5
    return max(0.0, p - h), min(1.0, p + h)


def clear_decision(results: Sequence[Any], band: Band, z: float) -> tuple[bool, str | None] | None:
    """The band decision if the evidence so far makes it clear (see the module docstring), else None."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for r in results:
        groups[r.seed].append(r)
    m = len(groups)
    if m < 2:
        return None
    stats = group_stats(results)
    rates = [sum(1 for r in g if r.success) / len(g) for g in groups.values()]
    mean = sum(rates) / m
    sd = (sum((x - mean) ** 2 for x in rates) / (m - 1)) ** 0.5
    lo_s, hi_s = _ac_interval(stats["mean_success"], len(results), z)
    h = max(z * sd / m**0.5, (hi_s - lo_s) / 2)
    s_lo, s_hi = mean - h, mean + h
    a0 = _ac_interval(stats["frac_all0"], m, z)
    a1 = _ac_interval(stats["frac_all1"], m, z)
    if s_lo >= band.low and s_hi <= band.high and a0[1] <= band.max_all0 and a1[1] <= band.max_all1:
        return True, None
    too_easy = s_lo > band.high or a1[0] > band.max_all1
    too_hard = s_hi < band.low or a0[0] > band.max_all0
    if too_easy or too_hard:
        return judge(stats, band)  # clearly out: the point estimates say which way
    return None


def judge(stats: dict[str, float], band: Band) -> tuple[bool, str | None]:
    """(in band, which way to move: 'harder', 'easier' or None)."""
    s = stats["mean_success"]
    too_easy = s > band.high or stats["frac_all1"] > band.max_all1
    too_hard = s < band.low or stats["frac_all0"] > band.max_all0
    if not too_easy and not too_hard:
        return True, None
    if too_easy and too_hard:  # bimodal: move toward the middle of the band
        return False, "harder" if s > (band.low + band.high) / 2 else "easier"
    return False, "harder" if too_easy else "easier"


def _describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in params.items()) or "defaults"


def measure(
    policy: Any,
    factory: Callable[[], Environment],
    seeds: Sequence[int],
    rollouts: int,
    *,
    max_turns: int = 12,
    batch_size: int = 64,
    on_done: Callable[[Any], None] | None = None,
) -> list[Any]:
    from trace_cli.envs.rollout import rollout

    jobs = [(s, t) for s in seeds for t in range(rollouts)]
    return rollout(policy, factory, jobs, max_turns=max_turns, batch_size=batch_size, on_done=on_done)


def calibrate(
    *,
    factory_for: Callable[[dict[str, Any]], Callable[[], Environment]],
    params: dict[str, Any],
    policy_for: Callable[[int], Any],
    seeds: Sequence[int],
    rollouts: int,
    band: Band = Band(),
    max_attempts: int = 5,
    harder: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None,
    easier: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None,
    max_turns: int = 12,
    batch_size: int = 64,
    progress: Callable[[int, int], Any] | None = None,
    look: int = 0,
    z: float = 2.0,
) -> Calibration:
    """Measure, judge, adjust; `progress(attempt, total_episodes)` may return a context manager with `advance()`.
    `look` > 0: a sequential test, `look` seeds at a time (module docstring)."""
    attempts: list[Attempt] = []
    results: list[Any] = []
    current = dict(params)
    seeds = list(seeds)
    step = look if 0 < look < len(seeds) else len(seeds)
    for i in range(1, max_attempts + 1):
        policy = policy_for(i)
        t0 = time.monotonic()
        bar = progress(i, len(seeds) * rollouts) if progress else None
        factory = factory_for(current)
        results = []
        decided: tuple[bool, str | None] | None = None
        with bar if bar is not None else contextlib.nullcontext():
            for start in range(0, len(seeds), step):
                results += measure(
                    policy,
                    factory,
                    seeds[start : start + step],
                    rollouts,
                    max_turns=max_turns,
                    batch_size=batch_size,
                    on_done=(lambda r, b=bar: b.advance()) if bar is not None else None,
                )
                if start + step < len(seeds):
                    decided = clear_decision(results, band, z)
                    if decided is not None:
                        break
        stats = group_stats(results)
        ran = len({r.seed for r in results})
        ok, direction = decided if decided is not None else judge(stats, band)
        att = Attempt(
            i,
            dict(current),
            ran,
            rollouts,
            in_band=ok,
            wall_s=round(time.monotonic() - t0, 2),
            decided=f"clear after {ran} seeds" if decided is not None else "all seeds",
            **{k: round(v, 6) for k, v in stats.items()},
        )
        attempts.append(att)
        if ok:
            return Calibration(True, attempts, current, results)
        nxt = (harder if direction == "harder" else easier)(current)
        if nxt is None:
            att.next = f"needs {direction} but is already at the {'hardest' if direction == 'harder' else 'easiest'} setting"
            break
        if any(a.params == nxt for a in attempts):  # back and forth: the band falls between two settings
            att.next = (
                f"needs {direction}, but that setting ({_describe(nxt)}) was measured already: the band lies "
                "between two adjacent settings"
            )
            break
        if i == max_attempts:
            att.next = "no attempts left"
            break
        att.next = direction
        current = nxt
    return Calibration(False, attempts, current, results)


def reseed(policy: Any, seed: int) -> Any:
    """The one calibration policy, reseeded for an attempt (its sampling seed, a scripted policy's round)."""
    if hasattr(policy, "seed"):
        policy.seed = seed
    if hasattr(policy, "_round"):
        policy._round = 0
    return policy


def calibrate_as_configured(
    cal: dict[str, Any],
    policy: Any,
    *,
    seed: int,
    start: int,
    max_turns: int,
    factory_for: Callable[[dict[str, Any]], Callable[[], Environment]],
    params: dict[str, Any],
    harder: Callable[[dict[str, Any]], dict[str, Any] | None],
    easier: Callable[[dict[str, Any]], dict[str, Any] | None],
    progress: Callable[[int, int], Any] | None = None,
) -> Calibration:
    """`calibrate` as the synthesize config's `calibration` section says: its band, `seeds` seeds from `start`,
    `rollouts` each, `max_attempts`, `batch_size`; attempt i reseeds `policy` with seed * 1000 + i."""
    return calibrate(
        factory_for=factory_for,
        params=params,
        policy_for=lambda attempt: reseed(policy, seed * 1000 + attempt),
        seeds=list(range(start, start + cal["seeds"])),
        rollouts=cal["rollouts"],
        band=Band(cal["band"][0], cal["band"][1], cal["max_group_all0"], cal["max_group_all1"]),
        max_attempts=cal["max_attempts"],
        harder=harder,
        easier=easier,
        max_turns=max_turns,
        batch_size=cal["batch_size"],
        progress=progress,
        look=cal["look"],
        z=cal["z"],
    )


def failure(capability: str, result: Calibration, cal: dict[str, Any]) -> str:
    """Why calibration failed, with the numbers of every attempt (`cal`: the config's `calibration`)."""
    return (
        f"calibration of {capability} failed after {len(result.attempts)} attempt(s) "
        f"({result.rollouts_run} rollouts): the policy's success must "
        f"be in [{cal['band'][0]}, {cal['band'][1]}] with <= {cal['max_group_all0']:.0%} all-0 and <= "
        f"{cal['max_group_all1']:.0%} all-1 groups\n{result.summary()}"
    )
