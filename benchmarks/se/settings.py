"""The benchmark's settings: parsed from the command line once into a frozen `Settings`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, RESULTS

from se.targets import KNOWN, target

TRAINED = ("grpo_target", "trace")  # the methods a process may run
# option -> (default, default with --quick)
DEFAULTS = {
    "budgets": ("640,1280,2560", "640,1280"),
    "train_seeds": ("0,1,2", "0"),
    "held_out": ("500000:500200", "500000:500100"),
    "validation": ("600000:600100", "600000:600050"),
    "calibration": ("32x8", "16x8"),
    "moe_seeds": (16, 8),
}
# the settings a result file records; files of one experiment agree on them (--combine checks)
RECORDED = (
    "budgets", "episodes_per_step", "num_generations", "learning_rate", "diagnosis_rollouts", "calibration",
    "calibration_look", "calibration_attempts", "calibration_start", "moe_seeds", "moe_steps",
    "max_new_tokens", "validation", "base", "adapter_validation", "validation_every", "validation_patience",
    "env_tools", "purpose",
)  # fmt: skip
# GRPO's (LoRA) learning rate for both methods unless --learning-rate or a sweep says otherwise
LEARNING_RATE = 2e-3


def parse_learning_rate(text: str) -> dict[str, float]:
    """`--learning-rate`: one rate for every trained method ("2e-3") or one per method
    ("grpo_target=1e-3,trace=4e-3", naming each of them). ValueError with the reason."""
    if "=" not in text:
        return {m: float(text) for m in TRAINED}
    rates = {}
    for part in (p for p in text.split(",") if p):
        m, _, v = part.partition("=")
        if m not in TRAINED:
            raise ValueError(f"{m!r} is not a trained method ({', '.join(TRAINED)})")
        rates[m] = float(v)
    if set(rates) != set(TRAINED):
        raise ValueError(f"name a rate for each of {', '.join(TRAINED)} (or give one rate for all)")
    return rates


@dataclass(frozen=True)
class Settings:
    targets: tuple[str, ...]
    budgets: tuple[int, ...]
    train_seeds: tuple[int, ...]
    methods: tuple[str, ...]
    held_out: str
    validation: str
    calibration: str
    moe_seeds: int
    out: Path
    plot: Path
    quick: bool = False
    store: Path | None = None
    base: str = str(REPO / "examples" / "shop-mixed-base-agent")
    diagnosis_rollouts: int = 100
    calibration_look: int = 8
    calibration_attempts: int = 4
    calibration_start: str = "easiest"
    moe_steps: int = 150
    episodes_per_step: int = 32
    num_generations: int = 8
    learning_rate: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TRAINED, LEARNING_RATE))
    max_new_tokens: int = 120
    # early stopping of each TRACE adapter on its own environment's seeds (charged as `validation`)
    adapter_validation: str = "200000:200016"
    validation_every: int = 4
    validation_patience: int = 2
    env_tools: str = "target"  # synthesize's `tools`: what TRACE's environments offer
    combine: tuple[Path, ...] = ()
    # "lr_sweep": the trained methods are measured on the validation seeds (the test seeds are not touched);
    # `lr_sweep` (set by --learning-rate-from): the sweep that chose `learning_rate`, recorded in the result
    purpose: str = "test"
    lr_sweep: dict[str, Any] | None = None
    learning_rate_from: tuple[Path, ...] = ()
    preregistered: Path | None = None  # the pre-registration this run must match (se/freeze.py)
    tau2_user: str = "user=scripted"  # the user of τ²-bench targets (se/targets.py)
    restart_reason: str | None = None  # why this process is a restart (logged in `restarts`; not a setting)

    def target(self, name: str):
        """What `name` trains and is tested on (se/targets.py)."""
        return target(name, self.tau2_user)

    def held_out_of(self, name: str) -> str:
        """The test seeds of a target: its own (τ²'s test split) or --held-out."""
        return self.target(name).held_out or self.held_out

    def lr(self, method: str) -> float:
        return self.learning_rate[method]

    @property
    def cal_seeds(self) -> int:
        return int(self.calibration.split("x")[0])

    def adapter_validation_block(self) -> dict[str, Any] | None:
        """The `validation` block of TRACE's GRPO configs (None: off)."""
        if self.adapter_validation == "off":
            return None
        return {
            "seeds": self.adapter_validation,
            "every": self.validation_every,
            "patience": self.validation_patience,
        }

    @property
    def cal_rollouts(self) -> int:
        return int(self.calibration.split("x")[1])

    def record(self) -> dict[str, Any]:
        """What a result file keeps of the settings."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items() if k in RECORDED}


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(doc.split("\n\n")[-1:]),
    )
    add = ap.add_argument
    add(
        "--quick",
        action="store_true",
        help="1 training seed, budgets 640,1280, 100 test seeds, calibration 16x8",
    )
    add("--store", type=Path, default=None, help="store directory (default: a fresh temp dir)")
    add("--base", default=Settings.base, help="base model source")
    add(
        "--target",
        default="shop-mixed,shop",
        help="target environments, comma-separated (shop-mixed, shop; tau2-retail, tau2-airline: τ²-bench's own, "
        "trained on its train split and tested on its test split)",
    )
    add(
        "--tau2-user",
        default="user=scripted",
        help="the user of τ²-bench targets, as environment parameters: user=scripted (CPU smoke: not τ²-bench "
        "scores) or user=llm&user_model=openai:URL?model=NAME (the paper: the base model as the user)",
    )
    add("--budgets", default=None, help="rollout budgets, comma-separated (640,1280,2560)")
    add("--train-seeds", default=None, help="training seeds per method (0,1,2)")
    add("--held-out", default=None, help="held-out test seeds A:B (500000:500200)")
    add("--validation", default=None, help="validation seeds, to choose single_best (600000:600100)")
    add("--diagnosis-rollouts", type=int, default=100, help="TRACE's target rollouts to diagnose")
    add("--calibration", default=None, help="calibration seeds (at most) x rollouts per attempt (32x8)")
    add("--calibration-look", type=int, default=8, help="sequential test: seeds per look")
    add("--calibration-attempts", type=int, default=4, help="calibration attempts at most")
    add(
        "--calibration-start",
        choices=("easiest", "default"),
        default="easiest",
        help="the difficulty level calibration starts from: the template's easiest (a base that lacks the "
        "capability is usually below the band at the default level) or its default",
    )
    add(
        "--methods",
        default="grpo_target,trace",
        help="trained methods to run (comma-separated subset of grpo_target,trace); the base is always measured",
    )
    add("--moe-seeds", type=int, default=None, help="MoE gate transcripts per expert environment (16)")
    add("--moe-steps", type=int, default=150, help="MoE gate training steps")
    add("--episodes-per-step", type=int, default=32, help="GRPO episodes per optimizer step")
    add("--num-generations", type=int, default=8, help="GRPO group size")
    add(
        "--learning-rate",
        default=None,
        help=f"GRPO learning rate (LoRA): one for both methods (default {LEARNING_RATE}) or one each (grpo_target=1e-3,trace=4e-3)",
    )
    add(
        "--learning-rate-from",
        nargs="+",
        type=Path,
        default=None,
        metavar="JSON",
        help="take each method's learning rate from these --lr-sweep results (the best mean pass@1 on their "
        "validation seeds at the largest budget); the sweep, with its cost, is recorded in the result",
    )
    add(
        "--lr-sweep",
        action="store_true",
        help="a learning-rate sweep run: the trained methods are measured on --validation, never on the test "
        "seeds (one process per method and rate; then --learning-rate-from)",
    )
    add("--max-new-tokens", type=int, default=120)
    add(
        "--adapter-validation",
        default=Settings.adapter_validation,
        help="seeds A:B of each TRACE environment on which its adapter is evaluated every --validation-every "
        "steps and stopped after --validation-patience evaluations without a new best (the best is kept; the "
        "episodes are charged); 'off' = no early stopping",
    )
    add("--validation-every", type=int, default=Settings.validation_every)
    add("--validation-patience", type=int, default=Settings.validation_patience)
    add(
        "--env-tools",
        choices=("target", "needed"),
        default=Settings.env_tools,
        help="the tools TRACE's environments offer: the target's (an agent trained with every tool shown, as "
        "shop-mixed shows them) or only those their tasks need (the demo's small base, which took each shop "
        "family's own tool list as a cue)",
    )
    add(
        "--preregistered",
        type=Path,
        default=None,
        metavar="JSON",
        help="the pre-registration (benchmarks/preregistered/) this run must be: refused (exit 2) when its seeds, "
        "budget, learning rates, base agent or target differ (the target and base are checked by digest)",
    )
    add(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default: results/sample_efficiency_mixed[_quick].json)",
    )
    add("--plot", type=Path, default=None, help="PNG path (default: next to --out)")
    add(
        "--restart-reason",
        default=None,
        metavar="TEXT",
        help="why this process is started again over its OUT.partial.json (a crash, a machine stop, ...): "
        "appended with the time and commit to the result's `restarts` (every restart is logged; without this "
        "option its reason reads 'not given')",
    )
    add(
        "--combine",
        nargs="+",
        type=Path,
        default=None,
        metavar="JSON",
        help="no training: merge these result files (per target, seed or method) into one table; a file of a "
        "run from a dirty checkout (or one that does not say) is refused",
    )
    return ap


def parse_settings(argv: list[str] | None, doc: str) -> Settings:
    """The command line as Settings (exit 2 with the reason for a bad option); --quick gives smaller defaults,
    an option the command line names keeps its value."""
    ap = parser(doc)
    a = ap.parse_args(argv)
    for k, (full, quick) in DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if a.quick else full)
    known = KNOWN
    targets = tuple(t for t in a.target.split(",") if t)
    if not targets or set(targets) - set(known):
        ap.error(f"--target: a comma-separated subset of {','.join(known)}, not {a.target!r}")
    methods = tuple(m for m in a.methods.split(",") if m)
    if not methods or set(methods) - set(TRAINED):
        ap.error(f"--methods: a comma-separated subset of {','.join(TRAINED)}, not {a.methods!r}")
    try:
        budgets = tuple(sorted(int(x) for x in a.budgets.split(",")))
        seeds = tuple(int(x) for x in a.train_seeds.split(","))
        _ = [int(x) for x in a.calibration.split("x", 1)]
    except ValueError as e:
        ap.error(f"--budgets, --train-seeds and --calibration take integers ({e})")
    if a.learning_rate and a.learning_rate_from:
        ap.error("--learning-rate and --learning-rate-from: give one of them")
    if a.lr_sweep and a.learning_rate_from:
        ap.error("--lr-sweep measures a learning rate; --learning-rate-from uses a sweep's: give one of them")
    if a.lr_sweep:  # the sweep's trained methods are measured on the validation seeds, never the test seeds
        a.held_out = a.validation
    try:
        rates = parse_learning_rate(a.learning_rate or str(LEARNING_RATE))
    except ValueError as e:
        ap.error(f"--learning-rate: {e}")
    out = a.out or RESULTS / (
        "sample_efficiency_mixed_quick.json" if a.quick else "sample_efficiency_mixed.json"
    )
    return Settings(
        targets=targets,
        budgets=budgets,
        train_seeds=seeds,
        methods=methods,
        held_out=a.held_out,
        validation=a.validation,
        calibration=a.calibration,
        moe_seeds=a.moe_seeds,
        out=out,
        plot=a.plot or out.with_suffix(".png"),
        quick=a.quick,
        store=a.store,
        base=a.base,
        diagnosis_rollouts=a.diagnosis_rollouts,
        calibration_look=a.calibration_look,
        calibration_attempts=a.calibration_attempts,
        calibration_start=a.calibration_start,
        moe_steps=a.moe_steps,
        episodes_per_step=a.episodes_per_step,
        num_generations=a.num_generations,
        learning_rate=rates,
        max_new_tokens=a.max_new_tokens,
        adapter_validation=a.adapter_validation,
        validation_every=a.validation_every,
        validation_patience=a.validation_patience,
        env_tools=a.env_tools,
        combine=tuple(a.combine or ()),
        purpose="lr_sweep" if a.lr_sweep else "test",
        learning_rate_from=tuple(a.learning_rate_from or ()),
        preregistered=a.preregistered,
        tau2_user=a.tau2_user,
        restart_reason=a.restart_reason,
    )
