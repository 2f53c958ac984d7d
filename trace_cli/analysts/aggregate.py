"""Pure functions of the contrastive selection (TRACE §2; ARCHITECTURE.md, "The method"), unit-tested on hand-computed cases.

Per labelling run and capability c, over episodes weighted by how often the run sampled them:
  ER⁻ = LACKING_failed / (LACKING_failed + PRESENT_failed)      (NA and ERROR labels excluded)
  ER⁺ = LACKING_passed / (LACKING_passed + PRESENT_passed)       (0 when no success needs c)
  Δ   = ER⁻ − ER⁺,   coverage = LACKING_failed / all failed episodes (ERROR-labelled ones left out)
A run passes c when coverage ≥ ρ and Δ ≥ δ (Δ undefined, i.e. no failure needs c, never passes);
c is selected when it passes in ≥ K of N runs; selected capabilities are sorted by mean Δ.
With bootstrap resampling the whole selection is repeated for several bootstrap seeds, and a capability is kept
when it is selected for at least a given share of them (`agreement`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunStats:
    lacking_failed: float = 0.0
    present_failed: float = 0.0
    lacking_passed: float = 0.0
    present_passed: float = 0.0
    na_failed: float = 0.0
    na_passed: float = 0.0
    errors: float = 0.0
    total_failed: float = 0.0
    total_passed: float = 0.0

    @property
    def er_minus(self) -> float | None:
        d = self.lacking_failed + self.present_failed
        return self.lacking_failed / d if d else None

    @property
    def er_plus(self) -> float:
        d = self.lacking_passed + self.present_passed
        return self.lacking_passed / d if d else 0.0

    @property
    def delta(self) -> float | None:
        em = self.er_minus
        return None if em is None else em - self.er_plus

    @property
    def coverage(self) -> float:
        return self.lacking_failed / self.total_failed if self.total_failed else 0.0

    def passes(self, rho: float, delta: float) -> bool:
        d = self.delta
        return d is not None and self.coverage >= rho - 1e-12 and d >= delta - 1e-12

    def to_dict(self) -> dict[str, Any]:
        return {
            "er_minus": self.er_minus,
            "er_plus": self.er_plus,
            "delta": self.delta,
            "coverage": self.coverage,
            "lacking_failed": self.lacking_failed,
            "present_failed": self.present_failed,
            "lacking_passed": self.lacking_passed,
            "present_passed": self.present_passed,
            "na_failed": self.na_failed,
            "na_passed": self.na_passed,
            "errors": self.errors,
        }


def run_stats(rows: Iterable[tuple[bool, str, float]]) -> RunStats:
    """rows: (episode succeeded?, label, weight) for one capability in one run. ERROR labels (the analyst
    gave no usable answer) are counted in `errors` only: they enter neither the rates nor the coverage
    denominator, since nothing is known about those episodes."""
    s = RunStats()
    for success, label, w in rows:
        if w <= 0:
            continue
        if label not in ("LACKING", "PRESENT", "NA"):
            s.errors += w
            continue
        outcome = "passed" if success else "failed"
        field = {"LACKING": "lacking", "PRESENT": "present", "NA": "na"}[label] + "_" + outcome
        setattr(s, "total_" + outcome, getattr(s, "total_" + outcome) + w)
        setattr(s, field, getattr(s, field) + w)
    return s


@dataclass
class Selection:
    capability: str
    runs: list[RunStats]
    passed: list[bool]
    selected: bool
    mean_delta: float
    std_delta: float
    mean_coverage: float
    std_coverage: float
    example_failed: list[str] = field(default_factory=list)

    @property
    def runs_passed(self) -> int:
        return sum(self.passed)


def _mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    return statistics.fmean(xs), (statistics.pstdev(xs) if len(xs) > 1 else 0.0)


def select(
    per_run: dict[str, list[RunStats]],
    *,
    rho: float,
    delta: float,
    k: int,
    examples: dict[str, list[str]] | None = None,
) -> list[Selection]:
    """Apply the dual threshold per run and the K-of-N consistency rule; selected first, by mean Δ."""
    out = []
    for cap, runs in per_run.items():
        passed = [r.passes(rho, delta) for r in runs]
        md, sd = _mean_std([r.delta if r.delta is not None else 0.0 for r in runs])
        mc, sc = _mean_std([r.coverage for r in runs])
        out.append(
            Selection(
                cap, runs, passed, sum(passed) >= k, md, sd, mc, sc, list((examples or {}).get(cap, []))[:8]
            )
        )
    out.sort(key=lambda s: (not s.selected, -s.mean_delta, s.capability))
    return out


def agreement(selections: list[list[Selection]]) -> dict[str, float]:
    """How often each capability was selected across bootstrap seeds (one selection each); the diagnosis keeps
    a capability when that frequency reaches its `agreement` share (no single bootstrap seed decides)."""
    n = len(selections) or 1
    caps = {s.capability for sel in selections for s in sel}
    return {
        c: sum(any(s.capability == c and s.selected for s in sel) for sel in selections) / n for c in caps
    }


def set_agreement(selections: list[list[Selection]], agreed: set[str]) -> float:
    """The share of bootstrap seeds whose selection is exactly the agreed set (the stability the diagnosis
    reports: one number for the whole choice, where `agreement` gives each capability's)."""
    n = len(selections) or 1
    return sum({s.capability for s in sel if s.selected} == agreed for sel in selections) / n
