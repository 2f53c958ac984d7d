#!/usr/bin/env python
"""The mechanism test's feasibility gates (issue 44, item 5): can the test pass at all, before any test seed?

From the planted base agent (`--base`, recipes/mechanism-base-agent.yaml) on one target (`shop-ladder` or
`shop-mixed`), every choice and measurement on validation seeds (`--validation`) or on the target's training
range (diagnosis and GRPO rollouts, 300000+), never on a test seed (every seed range must lie below TEST_FLOOR):

  1. diagnosis    the rules diagnosis of the base's own target rollouts selects every planted capability in
                  >= 8 of 10 bootstrap seeds (read from the diagnosis: exact when the agreed set is the planted
                  set, else the Fréchet lower bound of the joint from each capability's frequency; otherwise
                  the test needs a labelled oracle-selection arm);
  2. calibration  each planted capability's environment, synthesized from that diagnosis and calibrated on the
                  base, is admitted (its success lands in the calibration band) — one gate per capability;
  3. isolated     each calibrated environment's GRPO adapter, trained with <= --isolated-budget rollouts (640),
                  lifts its single-skill family (shop-ladder: ladder-<skill>) on the validation seeds by >= 0.2
                  over the base — one gate per capability;
  4. ceiling      the perfect-expert ceiling is >= 2.5x GRPO-on-target's validation gain: GRPO on the target
                  with --grpo-budget rollouts (2560) gives the gain; the ceiling is the share of validation
                  tasks the base fails whose LACKING capabilities (the rules analyst, on the base's episode,
                  distractors left out) are all among the calibrated environments' — planted, and any other the
                  diagnosis selected (TRACE trains those too; calibrated here, no gate of their own) — what ideal
                  experts, ideally routed, could fix.
                  A GRPO gain <= 0 passes when the ceiling's gain is > 0.

With `--control` (the capacity control, nothing withheld), three gates come first: it reaches >= 0.8 on each
planted skill's single-skill family (otherwise that skill is a capacity limit of the model, not a deficit).

The planted set is what the base's demonstrations of that target's tasks withheld (`PLANTED_ON`): both skills
on shop-ladder (the refusal and the lookup); on shop-mixed the refusal (its tasks have no by-name return).

A failing gate stops the mechanism test before any test seed and is the reported result. Prints a table and
writes JSON (each gate: threshold, measured value, pass/fail, details; the base's digest; every artifact's uri;
the commit): `--out` (default benchmarks/results/mechanism_gates_<target>.json). Resumable: every stage runs in
`--store` and a rerun skips what it holds.

    OMP_NUM_THREADS=1 python benchmarks/mechanism_gates.py --base examples/mechanism-base-agent \\
        --target shop-ladder --store stores/gates-ladder
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, at_start, command, machine, print_table, write_result
from se.freeze import dir_sha256
from se.measure import Bench

from trace_cli.config.seeds import parse_seeds
from trace_cli.envs.ladder import PLANTED, PLANTED_ON_MIXED, SKILLS
from trace_cli.errors import CheckFailed, TraceError

TEST_FLOOR = 700000  # every test range of the sample-efficiency benchmarks starts here (mechanism: 800000+)
TRAIN = (
    300000  # the target's own training range (diagnosis, GRPO on the target), as benchmarks/se/settings.py
)
MAX_TURNS = {"shop-ladder": 16, "shop-mixed": 16}
# a planted capability's single-skill family on each target (shop-mixed has none for the lookup)
SINGLE_FAMILY = {
    "shop-ladder": {cap: f"shop-ladder-ladder-{skill}" for skill, cap in SKILLS.items()},
    "shop-mixed": {"precondition_verification": "shop-mixed-cancel_order"},
}
# the skills planted in the base's demonstrations of each target's tasks: on shop-mixed's half of them only
# refusals are withheld (its tasks have no by-name return: no lookup deficit to find there)
PLANTED_ON = {"shop-ladder": list(PLANTED), "shop-mixed": list(PLANTED_ON_MIXED)}
MIN_DIAGNOSIS_SHARE = 0.8  # of --bootstrap-seeds: 8 of 10
MIN_LIFT = 0.2
MIN_CONTROL = 0.8  # the capacity control on each planted skill's single-skill family
MIN_CEILING_RATIO = 2.5


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--base", required=True, help="the planted base agent (a model directory or store uri)")
    add(
        "--control",
        default=None,
        help="the capacity control (recipes/mechanism-capacity-control.yaml's model): gated first, >= 0.8 on each "
        "planted skill's single-skill family",
    )
    add("--target", choices=sorted(MAX_TURNS), default="shop-ladder")
    add(
        "--validation",
        default="600000:600270",
        help="validation seeds A:B of the target (270: 30 per one-skill family)",
    )
    add("--diagnosis-rollouts", type=int, default=100, help="the base's target rollouts the diagnosis labels")
    add("--bootstrap-seeds", type=int, default=10)
    add("--calibration", default="32x8", help="calibration seeds (at most) x rollouts per attempt")
    add("--calibration-look", type=int, default=8)
    add("--calibration-attempts", type=int, default=4)
    add(
        "--calibration-set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="another key of synthesize's calibration block (e.g. band=[0,1]: the plumbing test's tiny model)",
    )
    add("--isolated-budget", type=int, default=640, help="rollouts of each isolated adapter's GRPO run")
    add("--grpo-budget", type=int, default=2560, help="rollouts of GRPO on the target")
    add("--episodes-per-step", type=int, default=32)
    add("--num-generations", type=int, default=8)
    add("--learning-rate", type=float, default=2e-3, help="the isolated adapters' GRPO rate")
    add("--grpo-learning-rate", type=float, default=1e-3, help="GRPO on the target's rate")
    add("--max-new-tokens", type=int, default=120)
    add("--seed", type=int, default=0)
    add("--store", type=Path, default=None, help="store directory (default: a fresh temp dir)")
    add("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    ranges = {
        "--validation": a.validation,
        "diagnosis": f"{TRAIN}:{TRAIN + a.diagnosis_rollouts}",
    }
    for what, spec in ranges.items():
        seeds = parse_seeds(spec)
        if not seeds or max(seeds) >= TEST_FLOOR:
            ap.error(f"{what} {spec}: the gates run below seed {TEST_FLOOR} only (test seeds start there)")
    try:
        a.calibration_set = {k: json.loads(v) for k, _, v in (x.partition("=") for x in a.calibration_set)}
    except ValueError as e:
        ap.error(f"--calibration-set KEY=JSON: {e}")
    if a.isolated_budget < a.episodes_per_step or a.grpo_budget < a.episodes_per_step:
        ap.error("--isolated-budget and --grpo-budget must be at least --episodes-per-step")
    a.out = a.out or RESULTS / f"mechanism_gates_{a.target}.json"
    return a


def gate(name: str, threshold: str, measured: Any, passed: bool, **details: Any) -> dict[str, Any]:
    return {"gate": name, "threshold": threshold, "measured": measured, "pass": bool(passed), **details}


def grpo(
    a: argparse.Namespace, env: str, model: str, budget: int, lr: float, max_turns: int
) -> dict[str, Any]:
    return {
        "method": "grpo",
        "env": env,
        "model": model,
        "seed": a.seed,
        "max_steps": max(1, budget // a.episodes_per_step),
        "num_generations": a.num_generations,
        "per_device_batch_size": a.episodes_per_step,
        "gradient_accumulation_steps": 1,
        "learning_rate": lr,
        "lr_scheduler": "constant",
        "max_new_tokens": a.max_new_tokens,
        "max_completion_length": 1024,
        "max_turns": max_turns,
        "checkpoint_every": 5,
        "require_learning": False,
    }


def synthesize(a: argparse.Namespace, b: Bench, d_art, cap: str, base: str, target: str):
    """(environment artifact or None, what its calibration did) for one selected capability."""
    n_cal, k_cal = (int(x) for x in a.calibration.split("x"))
    cfg = {
        "diagnosis": d_art.uri,
        "capability": cap,
        "target": target,
        "tools": "target",
        "model": base,
        "seed": a.seed,
        "params": {"level": 0},
        "calibration": {
            "seeds": n_cal,
            "rollouts": k_cal,
            "look": a.calibration_look,
            "max_attempts": a.calibration_attempts,
            "max_new_tokens": a.max_new_tokens,
            "max_completion_length": 1024,
            "tokens": True,
            **a.calibration_set,
        },
    }
    try:
        env = b.run(f"synthesize/{cap}", "synthesize", cfg).outputs["environment"]
    except (CheckFailed, TraceError) as e:  # out of band at every level tried (or refused): no environment
        ran = int((getattr(e, "details", None) or {}).get("rollouts_run") or 0)
        return None, {"why": str(e)[:300], "calibration_rollouts": ran}
    s = env.summary
    return env, {
        "mean_success": s.get("mean_success"),
        "hint_share": s.get(
            "hint_share"
        ),  # the curriculum-matched baseline's share (GRPO on the target, hinted)
        "mean_success_unhinted": s.get("mean_success_unhinted"),
        "environment": env.uri,
        "params": s.get("params"),
        "calibration_rollouts": b.calibration_rollouts(env),
    }


def diagnosis_gate(b: Bench, d_art, planted: list[str], n_seeds: int) -> dict[str, Any]:
    """Gate 1 from the diagnosis artifact: in how many bootstrap seeds every planted capability was selected."""
    import yaml

    need = math.ceil(MIN_DIAGNOSIS_SHARE * n_seeds - 1e-9)
    doc = yaml.safe_load((d_art.path / "capabilities.yaml").read_text())
    freq = {e["name"]: e.get("selection_frequency", 0.0) for e in doc["selected"] + doc["rejected"]}
    selected = sorted(d_art.summary.get("selected", []))
    f = {c: float(freq.get(c, 0.0)) for c in planted}
    if selected == sorted(planted):  # exact: the share of seeds whose selection is exactly this set
        joint, how = (
            round(d_art.summary["selection_set_agreement"] * n_seeds),
            "exact (agreed set = planted set)",
        )
    else:  # the joint frequency is at least 1 - sum of misses (Fréchet), at most the smallest frequency
        joint = max(0, round(n_seeds * (1 - sum(1 - v for v in f.values()))))
        how = f"lower bound (agreed set {selected} is not the planted set); upper {round(n_seeds * min(f.values()))}"
    return gate(
        "diagnosis selects the planted set",
        f">= {need} of {n_seeds} bootstrap seeds",
        joint,
        joint >= need,
        joint_is=how,
        selection_frequency=f,
        selected=selected,
        diagnosis=d_art.uri,
    )


def substantive() -> list[str]:
    """The catalog's capabilities that are not distractors and have a rules detector (what an expert could be)."""
    from importlib import resources

    import yaml

    from trace_cli.analysts.rules import DETECTORS

    text = (resources.files("trace_cli") / "catalog" / "capabilities.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    caps = doc["capabilities"] if isinstance(doc, dict) else doc
    return sorted(c["name"] for c in caps if not c.get("distractor") and c["name"] in DETECTORS)


def ceiling(b: Bench, base_ev: dict[str, Any], experts: list[str]) -> dict[str, Any]:
    """The share of validation tasks the base fails whose LACKING capabilities (the rules analyst on the base's
    episode; distractors left out) are all experts': ideal experts, ideally routed, fix exactly those."""
    from trace_cli.analysts.rules import needs
    from trace_cli.store.rollouts import read_episodes

    art = b.store.resolve(base_ev["rollouts"], kind="rollouts")
    eps = read_episodes(art.path)
    caps = substantive()
    fixable, failed, lacking_sets = 0, 0, {}
    for ep in eps:
        if ep["success"]:
            continue
        failed += 1
        lacking = sorted(c for c, lab in needs(ep, caps).items() if lab == "LACKING")
        key = "+".join(lacking) or "(none)"
        lacking_sets[key] = lacking_sets.get(key, 0) + 1
        fixable += bool(lacking) and set(lacking) <= set(experts)
    n = max(1, len(eps))
    return {
        "episodes": len(eps),
        "failed": failed,
        "fixable": fixable,
        "gain": round(fixable / n, 4),
        "capabilities": caps,
        "lacking_sets": dict(sorted(lacking_sets.items())),
    }


def main(argv: list[str] | None = None) -> int:
    import tempfile

    a = parse(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    store = a.store or Path(tempfile.mkdtemp(prefix="mechanism-gates-"))
    b = Bench(store, a.max_new_tokens)
    t0 = time.monotonic()
    mt, target, planted = MAX_TURNS[a.target], a.target, PLANTED_ON[a.target]
    base_path = Path(a.base) if Path(a.base).is_absolute() else REPO / a.base
    base = b.run("base/import", "model", {"source": str(base_path) if base_path.exists() else a.base})
    base_uri = base.outputs["model"].uri
    base_ev = b.eval("base/validation", base_uri, target, a.validation, max_turns=mt)
    gates: list[dict[str, Any]] = []
    # 0. the capacity control: can this model learn each planted skill at all (nothing withheld)?
    control = None
    if a.control:
        c_path = Path(a.control) if Path(a.control).is_absolute() else REPO / a.control
        src = str(c_path) if c_path.exists() else a.control
        c_uri = b.run("control/import", "model", {"source": src}).outputs["model"].uri
        c_ev = b.eval("control/validation", c_uri, target, a.validation, max_turns=mt)
        control = {
            "model": a.control,
            "digest": dir_sha256(c_path) if c_path.is_dir() else None,
            "pass@1": c_ev["pass@1"],
            "families": c_ev["families"],
        }
        for cap in planted:
            fam = SINGLE_FAMILY[target].get(cap)
            got = c_ev["families"].get(fam) if fam else None
            gates.append(
                gate(f"capacity control learns {cap} ({fam or 'no single-skill family'})", f">= {MIN_CONTROL}",
                     got, got is not None and got >= MIN_CONTROL - 1e-9, base=base_ev["families"].get(fam or ""))
            )  # fmt: skip
    # 1. the diagnosis of the base's own target rollouts (its training range)
    ro = b.run(
        "diagnosis/rollouts",
        "eval",
        {
            "model": base_uri,
            "env": target,
            "seeds": f"{TRAIN}:{TRAIN + a.diagnosis_rollouts}",
            "max_new_tokens": a.max_new_tokens,
            "max_turns": mt,
        },
    ).outputs["rollouts"]
    cfg = {"rollouts": ro.uri, "analyst": "rules", "seed": a.seed, "bootstrap_seeds": a.bootstrap_seeds}
    try:
        d_art = b.run("diagnosis", "diagnose", cfg).outputs["diagnosis"]
    except TraceError as e:  # e.g. no successful rollout to contrast with: the gate fails, saying why
        d_art = None
        gates.append(
            gate("diagnosis selects the planted set", f">= {math.ceil(MIN_DIAGNOSIS_SHARE * a.bootstrap_seeds)} of "
                 f"{a.bootstrap_seeds} bootstrap seeds", None, False, why=str(e)[:300], rollouts=ro.uri)
        )  # fmt: skip
    else:
        gates.append(diagnosis_gate(b, d_art, planted, a.bootstrap_seeds))
    # 2. each planted capability's environment, calibrated on the base (and, for the ceiling, the environment of
    # every other capability the diagnosis selected: TRACE would train those too; no gate)
    envs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    selected = list(d_art.summary.get("selected", [])) if d_art else []
    for cap in [*planted, *sorted(set(selected) - set(planted))]:
        name = f"{cap} calibrates on the base"
        if cap not in selected:
            why = "not selected" if d_art else "no diagnosis"
            gates.append(gate(name, "admitted", None, False, why=why))
            continue
        env, info = synthesize(a, b, d_art, cap, base_uri, target)
        if cap not in planted:
            extra[cap] = info
            if env is not None:
                envs[cap] = env
            continue
        gates.append(gate(name, "admitted", info.get("mean_success"), env is not None, **info))
        if env is not None:
            envs[cap] = env
    # 3. an isolated adapter per calibrated environment, its single-skill family on the validation seeds
    adapters: dict[str, dict[str, Any]] = {}
    for cap in planted:
        fam = SINGLE_FAMILY[target].get(cap)
        name = f"{cap} isolated adapter lifts {fam or '(no single-skill family)'}"
        if cap not in envs or fam is None:
            gates.append(
                gate(name, f">= +{MIN_LIFT}", None, False, why="no environment" if fam else "no family")
            )
            continue
        cfg = grpo(a, envs[cap].uri, base_uri, a.isolated_budget, a.learning_rate, 12)
        art = b.run(f"isolated/{cap}", "train", cfg).outputs["adapter"]
        ev = b.eval(f"isolated/{cap}/validation", art.uri, target, a.validation, max_turns=mt)
        before, after = base_ev["families"].get(fam), ev["families"].get(fam)
        lift = None if before is None or after is None else round(after - before, 4)
        adapters[cap] = {"adapter": art.uri, "pass@1": ev["pass@1"], "families": ev["families"]}
        rollouts = cfg["max_steps"] * a.episodes_per_step
        gates.append(
            gate(name, f">= +{MIN_LIFT}", lift, lift is not None and lift >= MIN_LIFT - 1e-9, base=before,
                 adapter=after, rollouts=rollouts, adapter_uri=art.uri)
        )  # fmt: skip
    # 4. the perfect-expert ceiling against GRPO on the target
    cfg = grpo(a, target, base_uri, a.grpo_budget, a.grpo_learning_rate, mt)
    cfg["seeds"] = f"{TRAIN}:{TRAIN + 100000}"
    g_art = b.run("grpo_target", "train", cfg).outputs["adapter"]
    g_ev = b.eval("grpo_target/validation", g_art.uri, target, a.validation, max_turns=mt)
    g_gain = round(g_ev["pass@1"] - base_ev["pass@1"], 4)
    ceil = ceiling(b, base_ev, sorted(envs))
    ratio = round(ceil["gain"] / g_gain, 3) if g_gain > 0 else None
    ok = (ratio is not None and ratio >= MIN_CEILING_RATIO) or (g_gain <= 0 and ceil["gain"] > 0)
    gates.append(
        gate("perfect-expert ceiling vs GRPO's gain", f">= {MIN_CEILING_RATIO}x", ratio, ok, ceiling_gain=ceil["gain"],
             grpo_gain=g_gain, grpo=g_ev["pass@1"], grpo_rollouts=cfg["max_steps"] * a.episodes_per_step,
             experts=sorted(envs), ceiling=ceil, grpo_adapter=g_art.uri)
    )  # fmt: skip
    res = {
        "benchmark": "mechanism_gates",
        **at_start(),
        "command": command(),
        "issue": 44,
        "target": target,
        "base": a.base,
        "base_digest": dir_sha256(base_path) if base_path.is_dir() else None,
        "planted": planted,
        "seeds": {
            "validation": a.validation,
            "diagnosis": f"{TRAIN}:{TRAIN + a.diagnosis_rollouts}",
            "grpo_target": cfg["seeds"],
            "test_floor": TEST_FLOOR,
        },
        "settings": {k: v for k, v in vars(a).items() if k not in ("store", "out", "base", "target")},
        "base_validation": {"pass@1": base_ev["pass@1"], "families": base_ev["families"]},
        "adapters": adapters,
        "other_selected_environments": extra,
        "control": control,
        "gates": gates,
        "passed": all(g["pass"] for g in gates),
        "store": str(store),
        "machine": machine(),
        "timings_s": b.timings,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    write_result(a.out, res)
    print_table(
        ["gate", "threshold", "measured", "pass"],
        [[g["gate"], g["threshold"], g["measured"], "PASS" if g["pass"] else "FAIL"] for g in gates],
    )
    print(f"\nall gates pass: {res['passed']}   JSON: {a.out}   wall {res['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
