"""What `trace report` shows, read from a store's artifacts (never from the index: the files are the truth).

Each collector returns plain dicts (no plotting here), so the data behind every figure is testable and also
written into the page as JSON for anyone who wants the numbers rather than the picture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from trace_cli.config import safe_yaml
from trace_cli.envs.artifact import read_environment
from trace_cli.errors import TraceError, UsageError
from trace_cli.store import Store


def _names(store: Store) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for kind, name, aid in store.names():
        out.setdefault((kind, aid), []).append(name)
    return out


def _label(art, names: dict[tuple[str, str], list[str]]) -> str:
    return sorted(names.get((art.kind, art.id), []) or [art.id])[0]


def _keep(art, names, only: set[str] | None) -> bool:
    if only is None or art.id in only:
        return True
    mine = names.get((art.kind, art.id), [])
    # a step that fans out names its artifacts NAME-KEY (one per capability): "NAME-*" in `only`
    return any(n in only or any(n.startswith(p[:-1]) for p in only if p.endswith("-*")) for n in mine)


def _kept(store: Store, kind: str, only: set[str] | None) -> list[tuple[Any, str]]:
    """The artifacts of `kind` the report shows (all, or those a recipe names), each with its label."""
    names = _names(store)
    return [(art, _label(art, names)) for art in store.list(kind) if _keep(art, names, only)]


def _yaml(path: Path) -> dict[str, Any]:
    return safe_yaml.load(path.read_bytes()) or {}


def diagnoses(store: Store, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per diagnosis: every capability's mean Δ and coverage, whether it was selected, and the thresholds."""
    out = []
    for art, label in _kept(store, "diagnosis", only):
        doc = _yaml(art.path / "capabilities.yaml")
        caps = []
        for status in ("selected", "rejected"):
            for c in doc.get(status) or []:
                caps.append(
                    {
                        "name": c["name"],
                        "selected": status == "selected",
                        "delta": float(c.get("mean_delta") or 0.0),
                        "delta_std": float(c.get("std_delta") or 0.0),
                        "coverage": float(c.get("mean_coverage") or 0.0),
                        "runs_passed": c.get("runs_passed"),
                        "runs_total": c.get("runs_total"),
                    }
                )
        th = doc.get("thresholds") or {}
        out.append(
            {
                "name": label,
                "rollouts": doc.get("rollouts"),
                "analyst": doc.get("analyst"),
                "delta_min": float(th.get("delta_min", 0.2)),
                "coverage_min": float(th.get("coverage_min", 0.1)),
                "capabilities": caps,
            }
        )
    return out


def calibrations(store: Store, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per environment: the calibration attempts (level, success) against the target band."""
    out = []
    for art, label in _kept(store, "environment", only):
        doc = read_environment(art)
        cal = doc.get("calibration") or {}
        attempts = []
        f = art.path / "calibration.parquet"
        if f.is_file():
            for r in pq.read_table(f).to_pylist():
                params = json.loads(r["params"]) if r.get("params") else {}
                attempts.append(
                    {
                        "attempt": r["attempt"],
                        "level": params.get("level"),
                        "success": r["mean_success"],
                        "all0": r["frac_all0"],
                        "in_band": r["in_band"],
                    }
                )
        out.append(
            {
                "name": label,
                "capability": doc.get("capability"),
                "model": cal.get("model"),
                "band": list(cal.get("band") or [0.2, 0.6]),
                "max_group_all0": cal.get("max_group_all0"),
                "attempts": attempts,
            }
        )
    return out


def reward_curves(store: Store, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per GRPO adapter: reward (and success) per optimizer step, with the rollouts consumed."""
    out = []
    for art, label in _kept(store, "adapter", only):
        if (art.summary or {}).get("snapshot_of"):
            continue  # a snapshot's curve is the first steps of its run's
        f = art.path / "train_metrics.parquet"
        if not f.is_file():
            continue
        rows = pq.read_table(f).to_pylist()
        out.append(
            {
                "name": label,
                "capability": (art.summary or {}).get("capability"),
                "steps": [r["step"] for r in rows],
                "reward": [r.get("reward") for r in rows],
                "success": [r.get("success") for r in rows],
                "rollouts": [r.get("rollouts") for r in rows],
            }
        )
    return out


def evals(store: Store, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per environment evaluated: every model's pass@1 and pass^k, overall and per task family."""
    by_env: dict[str, list[dict[str, Any]]] = {}
    for art, label in _kept(store, "eval", only):
        s = art.summary or {}
        cfg = art.config or {}
        env = str(cfg.get("env"))
        by_env.setdefault(env, []).append(
            {
                "name": label,
                "model": str(cfg.get("model")),
                "seeds": cfg.get("seeds"),
                "pass@1": s.get("pass@1"),
                "pass^k": s.get("pass^k") or {},
                "families": {f: v.get("pass@1") for f, v in (s.get("families") or {}).items()},
            }
        )
    return [{"env": env, "runs": runs} for env, runs in sorted(by_env.items())]


def routing(store: Store, only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per composition whose summary reports routing accuracy: overall and per expert."""
    out = []
    # a store from before compose existed simply has none
    for art, label in _kept(store, "composition", only):
        s = art.summary or {}
        acc = s.get("routing_accuracy")
        if acc is None:
            continue
        # compose writes routing_accuracy (overall) beside routing_accuracy_per_expert (compose/moe_train.py)
        per = s.get("routing_accuracy_per_expert") or (acc.get("per_expert") if isinstance(acc, dict) else {})
        overall = acc.get("overall") if isinstance(acc, dict) else acc
        out.append({"name": label, "method": s.get("method"), "overall": overall, "per_expert": per})
    return out


def _input(art, role: str) -> dict[str, Any] | None:
    """The artifact's input in `role` (its digest always; kind and id when it is an artifact), or None."""
    return next((i for i in art.manifest.get("inputs") or [] if i.get("role") == role), None)


def findings(store: Store, only: set[str] | None = None) -> dict[str, Any]:
    """What the loop found and fixed, the report's first screen: the capabilities each diagnosis selected with
    their gap; each environment's calibration (the admitted attempt); each adapter against its base on the same
    environment and seeds; each composition against its base on the same environment and seeds, per task
    family. Pairs are made from the artifacts' recorded inputs, so only like is compared with like."""
    names = _names(store)
    runs = []  # every eval: what model (by digest) on what env and seeds
    for art, label in _kept(store, "eval", only):
        model, env = _input(art, "model"), _input(art, "environment")
        env_name = str((art.config or {}).get("env"))
        if env and env.get("id"):
            env_name = _label_of(store, names, (str(env.get("kind")), str(env["id"])))
        runs.append(
            {
                "name": label,
                "model": (model or {}).get("digest"),
                "env": env["digest"] if env else env_name,
                "env_label": env_name,
                "seeds": str((art.config or {}).get("seeds")),
                "pass@1": (art.summary or {}).get("pass@1"),
                "families": {
                    f: v.get("pass@1") for f, v in ((art.summary or {}).get("families") or {}).items()
                },
            }
        )

    def against_base(kind: str) -> list[dict[str, Any]]:
        out = []
        for art, label in _kept(store, kind, only):
            if (art.summary or {}).get("snapshot_of"):
                continue
            base = (_input(art, "model") or {}).get("digest")
            for r in runs:
                if r["model"] != art.digest:
                    continue
                b = next(
                    (
                        x
                        for x in runs
                        if base and x["model"] == base and (x["env"], x["seeds"]) == (r["env"], r["seeds"])
                    ),
                    None,
                )
                fams = sorted(set(r["families"]) | set(b["families"] if b else {}))
                out.append(
                    {
                        "name": label,
                        "method": (art.summary or {}).get("method"),
                        "capability": (art.summary or {}).get("capability"),
                        "env": r["env_label"],
                        "seeds": r["seeds"],
                        "pass@1": r["pass@1"],
                        "base_pass@1": b["pass@1"] if b else None,
                        "gain": None
                        if b is None or None in (b["pass@1"], r["pass@1"])
                        else r["pass@1"] - b["pass@1"],
                        "families": {
                            f: {"base": (b["families"].get(f) if b else None), "this": r["families"].get(f)}
                            for f in fams
                        },
                    }
                )
        return out

    selected = []
    for d in diagnoses(store, only):
        for c in d["capabilities"]:
            if c["selected"]:
                selected.append({"diagnosis": d["name"], "rollouts": d["rollouts"], **c})
    envs = []
    for c in calibrations(store, only):
        admitted = [a for a in c["attempts"] if a["in_band"]]
        last = (admitted or c["attempts"] or [None])[-1]
        envs.append(
            {
                "name": c["name"],
                "capability": c["capability"],
                "band": c["band"],
                "attempts": len(c["attempts"]),
                "admitted": bool(admitted),
                "level": last["level"] if last else None,
                "success": last["success"] if last else None,
            }
        )
    return {
        "capabilities": selected,
        "environments": envs,
        "adapters": against_base("adapter"),
        "compositions": against_base("composition"),
    }


def _label_of(store: Store, names: dict[tuple[str, str], list[str]], ref: tuple[str, str]) -> str:
    return sorted(names.get(ref, []) or [ref[1]])[0]


def recipe_names(recipe: Path) -> set[str]:
    """The artifact names a recipe's steps write (what a report restricted to that recipe shows); a step that
    fans out writes NAME-KEY, one per capability, given as the pattern "NAME-*"."""
    from trace_cli.recipes.model import load_recipe

    try:
        steps = load_recipe(recipe).steps
    except TraceError:  # a recipe that no longer validates still names what it wrote
        doc = _yaml(recipe)
        return {str(s["name"]) for s in doc.get("steps") or [] if isinstance(s, dict) and s.get("name")}
    return {f"{s.name}-*" if s.fans_out else s.name for s in steps if s.name}


SE_METHODS = ("base", "grpo_target", "trace", "router", "moe", "merge", "single_best", "trace_train")


def _mean(v: Any) -> float | None:
    """A method's number in a budget row: the mean of a {mean, std, runs} cell (or a bare number, as files
    written before the per-target format hold)."""
    v = v.get("mean") if isinstance(v, dict) else v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _panel(target: str, t: Any, where: str) -> dict[str, Any]:
    rows = t.get("budgets") if isinstance(t, dict) else None
    if (
        not isinstance(rows, list)
        or not rows
        or not all(isinstance(r, dict) and "rollouts" in r for r in rows)
    ):
        raise UsageError(
            f"{where}: expected benchmarks/sample_efficiency.py's JSON: 'budgets' must be a list of rows with "
            "'rollouts'"
        )
    rows = sorted(rows, key=lambda r: r["rollouts"])
    methods = {}
    for m in SE_METHODS:
        cells = [r.get(m) for r in rows]
        mean = [_mean(c) for c in cells]
        std = [(c.get("std") or 0.0) if isinstance(c, dict) else 0.0 for c in cells]
        if any(x is not None for x in mean):
            methods[m] = {"mean": mean, "std": std}
    boot = t.get("bootstrap") or {}
    return {
        "target": target,
        "rollouts": [r["rollouts"] for r in rows],
        "methods": methods,
        "gain_ratio": [r.get("gain_ratio") for r in rows],
        "bootstrap": {str(b): v for b, v in boot.items() if v},
    }


def read_sample_efficiency(path: Path) -> dict[str, Any]:
    """benchmarks/sample_efficiency.py's result: one panel per target (`targets.<t>.budgets`; a file written
    before targets existed has one top-level `budgets`), each with every method's mean and std per budget, the
    gain ratio and the paired bootstrap. UsageError (exit 2) for a file that is neither."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not JSON ({e})") from None
    if isinstance(doc, dict) and isinstance(doc.get("targets"), dict) and doc["targets"]:
        panels = [_panel(t, v, f"{path}: targets.{t}") for t, v in sorted(doc["targets"].items())]
    elif isinstance(doc, dict) and "budgets" in doc:
        panels = [_panel(str(doc.get("target") or "shop"), doc, str(path))]
    else:
        raise UsageError(
            f"{path}: expected benchmarks/sample_efficiency.py's JSON (an object with 'targets', each with "
            "'budgets')"
        )
    keep = ("commit", "dirty", "commits", "held_out", "train_seeds", "command", "verdict")
    return {"file": str(path), **{k: doc.get(k) for k in keep}, "targets": panels}


def collect(
    store: Store, recipe: Path | None = None, sample_efficiency: Path | None = None
) -> dict[str, Any]:
    only = recipe_names(recipe) if recipe else None
    data = {
        "store": str(store.root),
        "recipe": str(recipe) if recipe else None,
        "diagnoses": diagnoses(store, only),
        "calibrations": calibrations(store, only),
        "reward_curves": reward_curves(store, only),
        "evals": evals(store, only),
        "routing": routing(store, only),
        "findings": findings(store, only),
        "sample_efficiency": None,
    }
    if sample_efficiency:
        data["sample_efficiency"] = read_sample_efficiency(sample_efficiency)
    return data
