"""Seed specifications of every stage that runs episodes: a range `A:B` (B exclusive) or a list of seeds, checked
against what the store can hold (seeds are int64) and what one run can sensibly mean."""

from __future__ import annotations

from typing import Any

from trace_cli.errors import UsageError

MAX_SEED = 2**63 - 1  # seeds are stored as int64 (episodes.seed)
MAX_SEEDS = 1_000_000  # seeds in one run (each is at least one rollout); more is a typo, and would not fit


def check_seed_range(a: int, b: int, spec: Any, what: str = "seeds") -> None:
    """0 <= A < B <= 2**63 - 1 (B exclusive), at most MAX_SEEDS seeds; a UsageError naming the key otherwise."""
    if a < 0 or b <= a:
        raise UsageError(f"{what}: {spec!r} is empty or negative; expected A:B with 0 <= A < B (B exclusive)")
    if b > MAX_SEED:
        raise UsageError(
            f"{what}: {spec!r} goes beyond the largest seed, 2**63-1 = {MAX_SEED} (seeds are stored as int64); "
            "use a smaller range"
        )


def parse_seeds(spec: Any) -> list[int]:
    if isinstance(spec, list):
        if len(set(spec)) != len(spec):
            raise UsageError("seeds: the list has duplicates")
        big = [s for s in spec if isinstance(s, int) and not 0 <= s <= MAX_SEED]
        if big:
            raise UsageError(f"seeds: {big[0]} is outside 0..2**63-1 (seeds are stored as int64)")
        return [int(s) for s in spec]
    try:
        a, b = (int(x) for x in str(spec).split(":"))
    except ValueError as e:
        raise UsageError(f"seeds: {spec!r} is not a range A:B (e.g. 0:100)") from e
    check_seed_range(a, b, spec)
    if b - a > MAX_SEEDS:
        raise UsageError(
            f"seeds: {spec!r} is {b - a:,} seeds; at most {MAX_SEEDS:,} per run (e.g. --seeds {a}:{a + 100})"
        )
    return list(range(a, b))
