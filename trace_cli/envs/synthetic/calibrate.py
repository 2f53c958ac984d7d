"""Calibration: run the policy on up to N seeds × K rollouts and adjust difficulty until success is in band.

One seed = one GRPO group. A group is constant when all its rollouts have the same *reward* (graded rewards
vary inside a group that never succeeds, and such a group still teaches): "constant-low" when that reward is
below 1, "all-1" when every rollout succeeds. In band (TRACE defaults): mean success in [0.2, 0.6], at most
20 % constant-low groups and at most 20 % all-1 groups. (All-0 *success* groups are still reported.)

Each attempt is a sequential test (`look` seeds at a time, `look=0`: all N at once): after every look, once at
least `min_seeds` (16) seeds ran, the band decision is taken if it is clear — every quantity's interval
(± z standard errors: group-level for mean success, Agresti-Coull for the constant-group shares) inside its
limits, or one of them wholly outside — and otherwise the next `look` seeds are run; at N seeds the point
estimates decide. An attempt records the seeds it ran, so what calibration costs (`rollouts_run`) is what ran.

Out of band the setting moves: too hard first turns on hints (`hint_share` of each group's rollouts see the
task's `<expert_guidance>`, see `hints`), so a level can be admitted through hints instead of by making tasks
capability-free; then one level at a time (`harder` / `easier`). Once a too-easy and a too-hard setting are
both known (a policy bimodal between adjacent levels), `between` bisects the numeric difficulty between them
(for the templates: `level + mix`) until in band, the settings are too close, or `max_attempts` ran out.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_cli.envs.base import Environment
from trace_cli.envs.synthetic.hints import hinted


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
    frac_constant_low: float
    mean_success_unhinted: float
    in_band: bool
    wall_s: float
    next: str = ""  # "harder", "easier", or why calibration stopped
    decided: str = "all seeds"  # "clear after N seeds" when the sequential test stopped early
    hint_share: float = 0.0  # share of each group's rollouts that saw the hint

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        p, mix = self.params.get("level"), self.params.get("mix")
        lv = f"level {p}{f' + mix {mix}' if mix else ''}, " if p is not None else ""
        lv += f"hints {self.hint_share:.2f}, " if self.hint_share else ""
        return (
            f"attempt {self.attempt} ({lv}{self.seeds}x{self.rollouts}, {self.decided}): success {self.mean_success:.3f}, "
            f"reward {self.mean_reward:.3f}, constant-low groups {self.frac_constant_low:.2f}, all-1 groups "
            f"{self.frac_all1:.2f}"
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


def _groups(results: Sequence[Any]) -> dict[int, list[Any]]:
    groups: dict[int, list[Any]] = defaultdict(list)
    for r in results:
        groups[r.seed].append(r)
    return groups


def group_stats(results: Sequence[Any], hints: int = 0) -> dict[str, float]:
    """Mean reward/success, the fractions of constant groups (a group = the rollouts of one seed; constant =
    one reward) and the success of the rollouts without hints (trials >= `hints`)."""
    groups = _groups(results)
    n = len(groups) or 1
    const = [g for g in groups.values() if len({round(r.reward, 9) for r in g}) == 1]
    all1 = sum(1 for g in groups.values() if all(r.success for r in g))
    total = len(results) or 1
    plain = [r for r in results if getattr(r, "trial", hints) >= hints]
    return {
        "mean_reward": sum(r.reward for r in results) / total,
        "mean_success": sum(1 for r in results if r.success) / total,
        "frac_all0": sum(1 for g in groups.values() if not any(r.success for r in g)) / n,
        "frac_all1": all1 / n,
        "frac_constant_reward": len(const) / n,
        "frac_constant_low": sum(1 for g in const if not all(r.success for r in g)) / n,
        "mean_success_unhinted": sum(1 for r in plain if r.success) / (len(plain) or 1),
    }


def _ac_interval(x: float, n: int, z: float) -> tuple[float, float]:
    """Agresti-Coull interval of a proportion x observed over n trials."""
    nt = n + z * z
    p = (x * n + z * z / 2) / nt
    h = z * (p * (1 - p) / nt) ** 0.5
    return max(0.0, p - h), min(1.0, p + h)


def clear_decision(
    results: Sequence[Any], band: Band, z: float, min_seeds: int
) -> tuple[bool, str | None] | None:
    """The band decision if the evidence so far makes it clear (see the module docstring), else None."""
    groups = _groups(results)
    m = len(groups)
    if m < max(2, min_seeds):
        return None
    stats = group_stats(results)
    rates = [sum(1 for r in g if r.success) / len(g) for g in groups.values()]
    mean = sum(rates) / m
    sd = (sum((x - mean) ** 2 for x in rates) / (m - 1)) ** 0.5
    lo_s, hi_s = _ac_interval(stats["mean_success"], len(results), z)
    h = max(z * sd / m**0.5, (hi_s - lo_s) / 2)
    s_lo, s_hi = mean - h, mean + h
    a0 = _ac_interval(stats["frac_constant_low"], m, z)
    a1 = _ac_interval(stats["frac_all1"], m, z)
    if s_lo >= band.low and s_hi <= band.high and a0[1] <= band.max_all0 and a1[1] <= band.max_all1:
        return True, None
    too_easy = s_lo > band.high or a1[0] > band.max_all1
    too_hard = s_hi < band.low or a0[0] > band.max_all0
    if too_easy or too_hard:
        return judge(stats, band)  # clearly out: the point estimates say which way
    return None


def judge(stats: dict[str, float], band: Band) -> tuple[bool, str | None]:
    """(in band, which way to move: 'harder', 'easier' or None); constant-low groups count against `max_all0`."""
    s = stats["mean_success"]
    too_easy = s > band.high or stats["frac_all1"] > band.max_all1
    too_hard = s < band.low or stats.get("frac_constant_low", stats["frac_all0"]) > band.max_all0
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
    hints: int = 0,
    max_turns: int,
    batch_size: int,
    on_done: Callable[[Any], None] | None = None,
) -> list[Any]:
    """K rollouts of every seed; trials below `hints` see the task's hint (`hints.HintedEnv`)."""
    from trace_cli.envs.rollout import rollout
    from trace_cli.envs.synthetic.hints import HintedEnv

    jobs = [(s, t) for s in seeds for t in range(rollouts)]
    kw = {"max_turns": max_turns, "batch_size": batch_size, "on_done": on_done}
    out = rollout(policy, lambda: HintedEnv(factory()), [j for j in jobs if j[1] < hints], **kw)
    return out + rollout(policy, factory, [j for j in jobs if j[1] >= hints], **kw)


@dataclass
class Search:
    """Where the next attempt goes: the last settings found too easy / too hard, and how to move."""

    harder: Callable[[dict[str, Any]], dict[str, Any] | None]
    easier: Callable[[dict[str, Any]], dict[str, Any] | None]
    hint_share: float  # the calibration's hint share, turned on once an attempt is too hard
    between: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] | None = None
    easy: dict[str, Any] | None = None
    hard: dict[str, Any] | None = None

    def next(self, current: dict[str, Any], direction: str, measured: list[dict]) -> tuple[dict | None, str]:
        """(the next setting, how it was chosen) or (None, why the search stops)."""
        setattr(self, "easy" if direction == "harder" else "hard", current)
        if direction == "easier" and self.hint_share > 0 and not current.get("hint_share"):
            self.easy = self.hard = None  # a new axis: the settings without hints bound nothing
            return {**current, "hint_share": self.hint_share}, f"easier: hints for {self.hint_share:.0%}"
        if self.easy is not None and self.hard is not None and self.between is not None:
            mid = self.between(self.easy, self.hard)
            if mid is not None and mid not in measured:
                return mid, f"between {_describe(self.easy)} and {_describe(self.hard)}"
        nxt = (self.harder if direction == "harder" else self.easier)(current)
        if nxt is None:
            end = "hardest" if direction == "harder" else "easiest"
            return None, f"needs {direction} but is already at the {end} setting"
        if nxt in measured:
            return None, (
                f"needs {direction}, but that setting ({_describe(nxt)}) was measured already: the band lies "
                "between two adjacent settings"
            )
        return nxt, direction


def _attempt(i, current, policy, factory, seeds, rollouts, band, *, step, z, min_seeds, bar, **kw) -> tuple:
    """One attempt's results and Attempt (its sequential test: `step` seeds at a time)."""
    t0, results = time.monotonic(), []
    hints = hinted(float(current.get("hint_share", 0.0)), rollouts)
    decided: tuple[bool, str | None] | None = None
    with bar if bar is not None else contextlib.nullcontext():
        for start in range(0, len(seeds), step):
            done = (lambda r, b=bar: b.advance()) if bar is not None else None
            results += measure(
                policy, factory, seeds[start : start + step], rollouts, hints=hints, on_done=done, **kw
            )
            if start + step < len(seeds):
                decided = clear_decision(results, band, z, min_seeds)
                if decided is not None:
                    break
    stats = group_stats(results, hints)
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
        hint_share=round(hints / rollouts, 6),
        **{k: round(v, 6) for k, v in stats.items()},
    )
    return att, direction, results


def calibrate(
    *,
    factory_for: Callable[[dict[str, Any]], Callable[[], Environment]],
    params: dict[str, Any],
    policy_for: Callable[[int], Any],
    seeds: Sequence[int],
    rollouts: int,
    band: Band = Band(),
    max_attempts: int,
    harder: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None,
    easier: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None,
    between: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] | None = None,
    hint_share: float,
    max_turns: int,
    batch_size: int,
    progress: Callable[[int, int], Any] | None = None,
    look: int,
    z: float,
    min_seeds: int,
) -> Calibration:
    """Measure, judge, adjust (module docstring); `progress(attempt, total_episodes)` may return a context
    manager with `advance()`. `look` > 0: a sequential test, `look` seeds at a time."""
    attempts: list[Attempt] = []
    results: list[Any] = []
    current, seeds = dict(params), list(seeds)
    step = look if 0 < look < len(seeds) else len(seeds)
    search = Search(harder, easier, hint_share, between)
    for i in range(1, max_attempts + 1):
        bar = progress(i, len(seeds) * rollouts) if progress else None
        att, direction, results = _attempt(
            i, current, policy_for(i), factory_for(current), seeds, rollouts, band,
            step=step, z=z, min_seeds=min_seeds, bar=bar, max_turns=max_turns, batch_size=batch_size,
        )  # fmt: skip
        attempts.append(att)
        if att.in_band:
            return Calibration(True, attempts, current, results)
        nxt, att.next = search.next(current, direction, [a.params for a in attempts])
        if nxt is None:
            break
        if i == max_attempts:
            att.next = "no attempts left"
            break
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
    `rollouts` each, `max_attempts`, `batch_size`, `hint_share`, `min_seeds`; attempt i reseeds `policy` with
    seed * 1000 + i. Bisection between levels is on where the environment has `between` (the templates)."""
    between = getattr(type(factory_for(params)()), "between", None)
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
        between=between,
        hint_share=cal["hint_share"],
        min_seeds=cal["min_seeds"],
    )


def failure(capability: str, result: Calibration, cal: dict[str, Any]) -> str:
    """Why calibration failed, with the numbers of every attempt (`cal`: the config's `calibration`)."""
    return (
        f"calibration of {capability} failed after {len(result.attempts)} attempt(s) "
        f"({result.rollouts_run} rollouts): the policy's success must "
        f"be in [{cal['band'][0]}, {cal['band'][1]}] with <= {cal['max_group_all0']:.0%} constant-low and <= "
        f"{cal['max_group_all1']:.0%} all-1 groups\n{result.summary()}"
    )
