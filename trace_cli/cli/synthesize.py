"""`trace synthesize`: build a checked, calibrated training environment for each diagnosed capability."""

from __future__ import annotations

from trace_cli.cli.common import echo_json, info, open_store, print_table
from trace_cli.cli.options import Flag, StageOptions


def _check_rows(checks: list[dict] | dict) -> list[list]:
    items = checks.items() if isinstance(checks, dict) else ((c["name"], c) for c in checks)
    return [[n, "ok" if c["passed"] else "FAILED", c["seeds"], c["message"]] for n, c in items]


def _attempt_rows(attempts: list[dict]) -> list[list]:
    return [
        [
            a["attempt"],
            a["params"].get("level", "-"),
            f"{a['seeds']}x{a['rollouts']}",
            a["mean_success"],
            a["mean_reward"],
            a["frac_all0"],
            a["frac_all1"],
            "yes" if a["in_band"] else "no",
            a.get("next", ""),
        ]
        for a in attempts
    ]


def _print(cap: str, checks, attempts: list[dict]) -> None:
    if checks:
        print_table(["check", "result", "seeds", "detail"], _check_rows(checks), title=f"{cap}: checks")
    if attempts:
        print_table(
            [
                "attempt",
                "level",
                "seeds x rollouts",
                "success",
                "reward",
                "all-0 groups",
                "all-1 groups",
                "in band",
                "then",
            ],
            _attempt_rows(attempts),
            title=f"{cap}: calibration",
        )


SYNTHESIZE = StageOptions(
    "synthesize",
    "--diagnosis",
    Flag("--capability", multiple=True, note="Default: every capability the diagnosis selected."),
    "--target",
    "--model",
    "--author",
    Flag("--level", "params.level"),
    Flag("--calibration-seeds", "calibration.seeds"),
    Flag("--calibration-rollouts", "calibration.rollouts"),
    Flag("--max-attempts", "calibration.max_attempts"),
    Flag("--temperature", "calibration.temperature"),
    Flag("--max-new-tokens", "calibration.max_new_tokens"),
    Flag("--batch-size", "calibration.batch_size"),
    "--max-turns",
    Flag("--base-url", "llm.base_url"),
    Flag("--llm-model", "llm.model"),
    Flag("--api-key-env", "llm.api_key_env"),
    "--unsafe-local-exec",
    "--strict",
    "--seed",
)


@SYNTHESIZE.command(
    epilog=(
        "Examples:\n\n  trace synthesize --diagnosis store://diagnosis/base --target shop --model store://model/base\n\n"
        "  trace synthesize --diagnosis d --capability precondition_verification --target store://rollouts/tau2-retail "
        "--model policy:random --calibration-seeds 20 --calibration-rollouts 4 --name demo\n\n"
        "One environment artifact per capability, named PREFIX-CAPABILITY (or CAPABILITY); use it with "
        "`trace eval --env store://environment/NAME`. Calibration needs the policy's success in "
        f"{SYNTHESIZE.default('calibration.band')} with <= {SYNTHESIZE.default('calibration.max_group_all0'):.0%} "
        f"all-0 and <= {SYNTHESIZE.default('calibration.max_group_all1'):.0%} all-1 seed groups; otherwise "
        "difficulty is adjusted (up to --max-attempts) and the command exits 1 with the numbers."
    ),
    outputs=(
        "Name prefix: artifacts are named PREFIX-CAPABILITY (default: CAPABILITY).",
        "Re-run even if an identical environment exists.",
    ),
    run=False,
)
def synthesize(name, force, as_json, store_dir, **flags):
    """Synthesize, check and calibrate one training environment per diagnosed capability."""
    from trace_cli.envs.artifact import read_environment
    from trace_cli.stages.base import execute_each, failed

    layers = SYNTHESIZE.merge(flags)
    SYNTHESIZE.check(layers)
    cfg = layers.config
    if isinstance(cfg.get("capability"), str):  # from --config: named PREFIX-CAPABILITY all the same
        cfg["capability"] = [cfg["capability"]]
    out, failures, members = [], [], []
    each = execute_each(
        "synthesize",
        cfg,
        open_store(store_dir),
        name=name,
        overrides=layers.applied,
        force=force,
        key_names=True,
    )
    for m in each:
        members.append(m)
        cap = m.key
        if m.failure is not None:
            d = getattr(m.failure, "details", {}) or {}
            failures.append({"capability": cap, "error": m.failure.message, **d})
            if not as_json:
                _print(cap, d.get("checks"), d.get("attempts") or [])
                info(f"error: {cap}: {m.failure.message}")
            continue
        art, skipped = m.outcome.main, m.outcome.skipped
        doc = read_environment(art)
        entry = {
            "capability": cap,
            "uri": art.uri,
            "id": art.id,
            "name": m.name,
            "skipped": skipped,
            "params": doc["params"],
            "checks": doc["checks"],
            "calibration": doc["calibration"],
        }
        out.append(entry)
        if not as_json:
            if skipped:
                info(f"up to date: {art.uri} (use --force to re-run)")
            _print(cap, doc["checks"], doc["calibration"]["attempts"])
            info(f"{cap}: store://environment/{m.name} ({art.uri})")
    if as_json:
        echo_json({"environments": out, "failures": failures})
    err = failed("synthesize", members)
    if err is not None:
        raise err
