"""The frozen target and base agent of the confirmatory run (issue 31), and its pre-registration.

`digests()` identifies what a run measures:
- `base`: sha256 of every file of the base agent's directory (paths and bytes);
- `target_source`: sha256 of the target's package, `trace_cli/envs/shop/` (tasks, tools, user, world, grading);
  a target built on further packages (`shop-ladder`: `trace_cli/envs/ladder/` too, `TARGET_PACKAGES`) hashes the
  shop's digest with theirs, so shop and shop-mixed keep the digest issue 31 registered;
- `target_tasks`: sha256 of what the target does on seeds 0..19 (first observation, tools, reference
  actions): it changes when anything the target relies on changes, even outside its package.
Seeds 0..19 are none of the benchmark's ranges (diagnosis and GRPO 300000+, test and validation 500000+).

A pre-registration (`benchmarks/preregistered/*.json`, schema `preregistration.schema.json`) fixes, before the
run, the digests, the test range (fresh: never evaluated before it was written), the training seeds, the
budget, the learning-rate grid, the decision rule and (`settings`) any benchmark setting the run must have.
`check()` refuses (exit 2) a run whose settings or
digests differ from it; the result records it (`preregistration`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from common import REPO

from se import sweep
from se.results import Refused, read
from se.settings import Settings

TARGET_PACKAGE = REPO / "trace_cli" / "envs" / "shop"
# targets that need more than the shop's package (in this order, after it)
TARGET_PACKAGES = {"shop-ladder": (REPO / "trace_cli" / "envs" / "ladder",)}
PROBE_SEEDS = range(20)
PREREGISTRATION = "preregistration"
# the registered decision rule (a registration's `decision` says it in words): at the registered budget, every
# rollout counted, the gain ratio of the means >= MIN_GAIN_RATIO and the paired bootstrap's one-sided 90 % lower
# bound of TRACE gain - GRPO gain > MIN_DIFFERENCE_LOWER_90, with every registered training seed of both methods
MIN_GAIN_RATIO = 2.0
MIN_DIFFERENCE_LOWER_90 = 0.0


def dir_sha256(root: Path) -> str:
    """sha256 of every file under `root` (relative path and bytes, in sorted order; caches skipped)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def tasks_sha256(target: str) -> str:
    """sha256 of the target's behaviour on PROBE_SEEDS: first observation, tools and reference actions."""
    from trace_cli.envs.registry import make_env

    env = make_env(target)
    h = hashlib.sha256()
    for seed in PROBE_SEEDS:
        obs = env.reset(seed=seed)
        doc = {"obs": obs.to_dict(), "reference": env.reference_actions()}
        h.update(json.dumps(doc, sort_keys=True, default=str).encode())
    return h.hexdigest()


def source_sha256(target: str) -> str:
    """`target_source`: the shop package's digest, alone (shop, shop-mixed) or hashed with the other packages
    the target needs (`TARGET_PACKAGES`)."""
    shop = dir_sha256(TARGET_PACKAGE)
    more = TARGET_PACKAGES.get(target, ())
    if not more:
        return shop
    return hashlib.sha256("\n".join([shop, *(dir_sha256(p) for p in more)]).encode()).hexdigest()


def digests(base: str, target: str) -> dict[str, str]:
    path = Path(base)
    path = path if path.is_absolute() else REPO / path
    return {
        "base": dir_sha256(path),
        "target_source": source_sha256(target),
        "target_tasks": tasks_sha256(target),
    }


def check(path: Path, s: Settings) -> dict[str, Any]:
    """The pre-registration at `path` if this run is one it registered (Refused otherwise, saying every
    difference), with the digests measured now. A run of the test: the registered test seeds, training seeds,
    budget, and each method's rate from a sweep over the registered grid; a sweep run (`--lr-sweep`): the
    registered validation seeds, sweep seed, budget and a rate of the grid."""
    reg = read(path, PREREGISTRATION)
    sweeping = s.purpose == "lr_sweep"
    off = []

    def expect(what: str, have: Any, want: Any) -> None:
        if have != want:
            off.append(f"{what} {have} (registered: {want})")

    expect("targets", list(s.targets), [reg["target"]])
    expect("budgets", list(s.budgets), [reg["budget"]])
    expect("validation", s.validation, reg["validation"])
    expect("base", s.base, reg["base"])
    seeds = [reg["lr_sweep_seed"]] if sweeping else reg["train_seeds"]
    if not set(s.train_seeds) <= set(seeds):
        off.append(f"train seeds {list(s.train_seeds)} (registered: {seeds})")
    if sweeping:
        expect("measured on", s.held_out, reg["validation"])
        rates = sorted({s.lr(m) for m in s.methods})
        if not set(rates) <= set(reg["lr_grid"]):
            off.append(f"learning rates {rates} (registered grid: {reg['lr_grid']})")
    else:
        expect("test seeds", s.held_out, reg["held_out"])
        if s.lr_sweep is None:
            off.append("no --learning-rate-from (the registered run takes each method's rate from the sweep)")
        else:
            expect("learning-rate sweep over", sweep.grid(s.lr_sweep), sorted(reg["lr_grid"]))
    mine = s.record()
    for k, v in (reg.get("settings") or {}).items():
        expect(k, mine.get(k), v)
    now = digests(s.base, reg["target"])
    for k, v in now.items():
        if v != reg["digests"][k]:
            off.append(f"{k} digest {v[:12]}... (registered: {reg['digests'][k][:12]}...)")
    if off:
        raise Refused(f"--preregistered {path}: not the registered run: " + "; ".join(off))
    return {"file": str(path), **reg, "digests_now": now}


def register(path: Path, reg: dict[str, Any]) -> Path:
    """Write a pre-registration (checked against its schema) with the digests measured now."""
    from se.results import write

    doc = {**reg, "digests": digests(reg["base"], reg["target"])}
    return write(path, doc, PREREGISTRATION)


def verdict(reg: dict[str, Any], targets: dict[str, Any]) -> dict[str, Any]:
    """The registered decision applied to a result's `targets`: the two numbers it reads, whether every
    registered training seed of both methods is in (`complete`), and `holds` (False until it is complete)."""
    t = targets.get(reg["target"]) or {}
    row = next((r for r in t.get("budgets", []) if r["rollouts"] == reg["budget"]), None)
    boot = (t.get("bootstrap") or {}).get(str(reg["budget"])) or {}
    ratio = row["gain_ratio"] if row else None
    lower = (boot.get("difference") or {}).get("lower_90")
    runs = {m: (row[m]["runs"] if row else 0) for m in ("grpo_target", "trace")}
    complete = all(n == len(reg["train_seeds"]) for n in runs.values()) and boot.get("seeds") == sorted(
        reg["train_seeds"]
    )
    ratio_ok = ratio is not None and ratio >= MIN_GAIN_RATIO
    lower_ok = lower is not None and lower > MIN_DIFFERENCE_LOWER_90
    return {
        "rule": f"gain ratio >= {MIN_GAIN_RATIO:g} and 90 % lower bound of TRACE gain - GRPO gain > "
        f"{MIN_DIFFERENCE_LOWER_90:g} at {reg['budget']} rollouts, {len(reg['train_seeds'])} training seeds "
        "per method",
        "budget": reg["budget"],
        "gain_ratio": ratio,
        "difference_lower_90": lower,
        "runs": runs,
        "complete": complete,
        "ratio_met": ratio_ok,
        "lower_bound_met": lower_ok,
        "holds": complete and ratio_ok and lower_ok,
    }
