"""`trace synthesize`: build a checked, calibrated training environment for each diagnosed capability."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


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


@click.command(
    epilog=(
        "Examples:\n\n  trace synthesize --diagnosis store://diagnosis/base --target shop --model store://model/base\n\n"
        "  trace synthesize --diagnosis d --capability precondition_verification --target store://rollouts/tau2-retail "
        "--model policy:random --calibration-seeds 20 --calibration-rollouts 4 --name demo\n\n"
        "One environment artifact per capability, named PREFIX-CAPABILITY (or CAPABILITY); use it with "
        "`trace eval --env store://environment/NAME`. Calibration needs the policy's success in [0.2, 0.6] with "
        "<= 20% all-0 and <= 20% all-1 seed groups; otherwise difficulty is adjusted (up to --max-attempts) and "
        "the command exits 1 with the numbers."
    )
)
@click.option("--diagnosis", required=True, help="Diagnosis artifact (from trace diagnose).")
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    help="Capability to synthesize (repeatable; default: every one the diagnosis selected).",
)
@click.option(
    "--target",
    default="shop",
    show_default=True,
    help="Registered env (shop) or a rollouts artifact whose tools are recovered (store://rollouts/NAME).",
)
@click.option(
    "--model",
    required=True,
    help="Policy that calibrates difficulty (store://model/NAME, HF dir, policy:random).",
)
@click.option(
    "--author",
    type=click.Choice(["template", "openai", "hf"]),
    default="template",
    show_default=True,
    help="Built-in template, or an LLM-written module checked in a sandbox.",
)
@click.option("--level", type=int, help="Initial difficulty level of the template (0 = easiest).")
@click.option("--calibration-seeds", type=int, help="N seeds (groups) per calibration attempt (default 100).")
@click.option("--calibration-rollouts", type=int, help="K rollouts per seed (default 16).")
@click.option("--max-attempts", type=int, help="Difficulty adjustments before giving up (default 5).")
@click.option("--temperature", type=float, help="Calibration sampling temperature (default 1.0).")
@click.option(
    "--max-new-tokens", type=int, help="Tokens per assistant turn during calibration (default 160)."
)
@click.option("--batch-size", type=int, help="Episodes generated together during calibration (default 64).")
@click.option("--max-turns", type=int, help="Agent actions per episode (default 12).")
@click.option("--base-url", help="openai author: the server's base URL (…/v1).")
@click.option("--llm-model", help="openai author: model name on the server; hf: a local model reference.")
@click.option("--api-key-env", help="openai author: env var holding the API key (never stored).")
@click.option(
    "--unsafe-local-exec",
    is_flag=True,
    help="Run LLM-written modules even where no OS sandbox (bubblewrap) works: in-process guards only.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option(
    "--name", "prefix", help="Name prefix: artifacts are named PREFIX-CAPABILITY (default: CAPABILITY)."
)
@click.option("--force", is_flag=True, help="Re-run even if an identical environment exists.")
@json_option
@store_option
def synthesize(
    diagnosis,
    capabilities,
    target,
    model,
    author,
    level,
    calibration_seeds,
    calibration_rollouts,
    max_attempts,
    temperature,
    max_new_tokens,
    batch_size,
    max_turns,
    base_url,
    llm_model,
    api_key_env,
    unsafe_local_exec,
    seed,
    prefix,
    force,
    as_json,
    store_dir,
):
    """Synthesize, check and calibrate one training environment per diagnosed capability."""
    from trace_cli.config.loading import load_artifact_yaml
    from trace_cli.errors import CheckFailed, UsageError
    from trace_cli.stages.base import execute
    from trace_cli.stages.synthesize import read_environment

    st = open_store(store_dir)
    if not capabilities:
        diag = st.resolve(diagnosis, kind="diagnosis")
        doc = load_artifact_yaml(diag.path / "capabilities.yaml")
        capabilities = [c["name"] for c in doc.get("selected") or []]
        if not capabilities:
            raise UsageError(f"diagnosis {diag.uri} selects no capability; nothing to synthesize")
    cal = {
        k: v
        for k, v in (
            ("seeds", calibration_seeds),
            ("rollouts", calibration_rollouts),
            ("max_attempts", max_attempts),
            ("temperature", temperature),
            ("max_new_tokens", max_new_tokens),
            ("batch_size", batch_size),
        )
        if v is not None
    }
    llm = {
        k: v
        for k, v in (("base_url", base_url), ("model", llm_model), ("api_key_env", api_key_env))
        if v is not None
    }
    out, failures = [], []
    for cap in capabilities:
        cfg = {
            "diagnosis": diagnosis,
            "capability": cap,
            "target": target,
            "model": model,
            "author": author,
            "seed": seed,
        }
        if unsafe_local_exec:
            cfg["unsafe_local_exec"] = True
        if level is not None:
            cfg["params"] = {"level": level}
        if cal:
            cfg["calibration"] = cal
        if llm:
            cfg["llm"] = llm
        if max_turns is not None:
            cfg["max_turns"] = max_turns
        name = f"{prefix}-{cap}" if prefix else cap
        try:
            res = execute("synthesize", cfg, st, name=name, force=force)
        except CheckFailed as e:
            d = getattr(e, "details", {}) or {}
            failures.append({"capability": cap, "error": e.message, **d})
            if not as_json:
                _print(cap, d.get("checks"), d.get("attempts") or [])
                info(f"error: {cap}: {e.message}")
            continue
        art = res.main
        doc = read_environment(art)
        entry = {
            "capability": cap,
            "uri": art.uri,
            "id": art.id,
            "name": name,
            "skipped": res.skipped,
            "params": doc["params"],
            "checks": doc["checks"],
            "calibration": doc["calibration"],
        }
        out.append(entry)
        if not as_json:
            if res.skipped:
                info(f"up to date: {art.uri} (use --force to re-run)")
            _print(cap, doc["checks"], doc["calibration"]["attempts"])
            info(f"{cap}: store://environment/{name} ({art.uri})")
    if as_json:
        echo_json({"environments": out, "failures": failures})
    if failures:
        caps = ", ".join(f["capability"] for f in failures)
        raise CheckFailed(
            f"{len(failures)} of {len(capabilities)} capabilit{'y' if len(capabilities) == 1 else 'ies'} "
            f"failed their checks or calibration: {caps}"
        )
