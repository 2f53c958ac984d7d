"""Stage `diagnose`: contrast failed and successful rollouts; keep the capabilities whose absence
separates them (TRACE step 1). Output: a `diagnosis` artifact with capabilities.yaml (selected and rejected,
schema-validated), labels.parquet (view `labels`), candidates.yaml and per-run statistics (view
`capability_runs`)."""

from __future__ import annotations

import copy
import random
import sys
from collections import Counter
from importlib import resources
from typing import Any

import yaml

from trace_cli.analysts.aggregate import agreement, run_stats, select, set_agreement
from trace_cli.analysts.base import Candidate
from trace_cli.config import safe_yaml
from trace_cli.config.loading import load_document
from trace_cli.config.schemas import validate
from trace_cli.errors import CheckFailed, NotFoundError, UsageError
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.hashing import sha256_json
from trace_cli.store.tables import CAPABILITY_RUNS, LABELS

NAME = "diagnose"
OUTPUTS = {"diagnosis": "diagnosis"}
PATH_KEYS = ("candidates",)
CAPS_FILE = "capabilities.yaml"
CANDIDATES_FILE = "candidates.yaml"


def load_catalog(path: str | None = None) -> list[Candidate]:
    if path in (None, "catalog"):
        text = (resources.files("trace_cli") / "catalog" / "capabilities.yaml").read_text(encoding="utf-8")
        source = "catalog"
        doc = safe_yaml.load(text)
    else:
        source = str(path)
        try:  # the hardened loader: duplicate keys, alias bombs and deep nesting are errors naming the file
            doc = load_document(path)
        except NotFoundError as e:
            raise UsageError(
                f"candidates: {path}: no such file (use 'catalog', 'discover' or a capabilities YAML)"
            ) from e
        except UsageError as e:
            raise UsageError(
                f"candidates: {e.message}",
                hint=e.hint
                or "a candidates file is a capabilities YAML (`kind: capabilities`, a `capabilities:` list "
                "of name + description); see trace_cli/catalog/capabilities.yaml",
            ) from e
    validate(doc, "capabilities.v1.json", source=source)
    return [
        Candidate(
            c["name"], " ".join(c["description"].split()), bool(c.get("distractor")), c.get("examples", [])
        )
        for c in doc["capabilities"]
    ]


def _episodes(art: Artifact) -> list[dict[str, Any]]:
    from trace_cli.store.rollouts import read_episodes

    return read_episodes(art.path)


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    cfg = checked_config(NAME, config)
    if cfg["min_runs"] > cfg["runs"]:
        raise UsageError(f"min_runs (K={cfg['min_runs']}) cannot exceed runs (N={cfg['runs']})")
    art = store.resolve(cfg["rollouts"], kind="rollouts")
    s = art.summary
    n_fail, n_pass = s.get("failures"), s.get("successes")
    if n_fail is None or n_pass is None:
        eps = _episodes(art)
        n_pass = sum(1 for e in eps if e["success"])
        n_fail = len(eps) - n_pass
    if n_fail == 0 or n_pass == 0:
        what = "no failures" if n_fail == 0 else "no successes"
        raise UsageError(
            f"{art.uri} has {what} ({n_pass} passed, {n_fail} failed): the contrast between failed "
            "and successful trajectories is undefined; evaluate on more or harder tasks"
        )
    llm = cfg.get("llm") or {}
    if cfg["analyst"] == "openai" and not (llm.get("base_url") and llm.get("model")):
        raise UsageError(
            "the openai analyst needs llm.base_url and llm.model (e.g. --base-url http://127.0.0.1:8000/v1 --llm-model NAME)"
        )
    if cfg["analyst"] == "hf" and not llm.get("model"):
        raise UsageError("the hf analyst needs llm.model (a local model dir or store://model/NAME)")
    if cfg["candidates"] == "discover":
        if cfg["analyst"] == "rules":
            raise UsageError(
                "candidates: discover needs an LLM analyst (openai or hf); rules only labels the catalogue"
            )
        cand_id: Any = "discover"
    else:
        cands = load_catalog(cfg["candidates"])
        if cfg.get("capabilities"):
            unknown = sorted(set(cfg["capabilities"]) - {c.name for c in cands})
            if unknown:
                raise UsageError(f"capabilities: not in the candidates: {', '.join(unknown)}")
        cand_id = [c.to_dict() for c in cands]
    inputs = [art.as_input("rollouts")]
    extra_inputs = []
    if cfg["analyst"] == "hf":
        from trace_cli.models.refs import resolve_model

        m = resolve_model(llm["model"], store)
        extra_inputs.append(m.as_input("analyst_model"))
    id_config = {**cfg, "rollouts": art.id, "candidates": sha256_json(cand_id)}
    p = Prepared(NAME, cfg, id_config, inputs + extra_inputs, dict(OUTPUTS)).finalize()
    p.extra["rollouts"] = art
    return p


def _stratified(eps: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    fail = [e for e in eps if not e["success"]]
    ok = [e for e in eps if e["success"]]
    nf = max(1, round(n * len(fail) / len(eps)))
    nf = min(nf, len(fail), n - 1)
    return rng.sample(fail, nf) + rng.sample(ok, min(len(ok), n - nf))


def _weights(eps: list[dict[str, Any]], run: int, seed: int, bootstrap: bool) -> dict[str, float]:
    """Episode -> multiplicity in this run; failures and successes are resampled separately so both stay."""
    if not bootstrap:
        return {e["episode_id"]: 1.0 for e in eps}
    rng = random.Random(seed * 1_000_003 + run)
    w: Counter[str] = Counter()
    for group in ([e for e in eps if not e["success"]], [e for e in eps if e["success"]]):
        for _ in range(len(group)):
            w[rng.choice(group)["episode_id"]] += 1
    return {e["episode_id"]: float(w.get(e["episode_id"], 0)) for e in eps}


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.analysts import get_analyst

    cfg = prepared.config
    art: Artifact = prepared.extra["rollouts"]
    eps = _episodes(art)
    rng = random.Random(cfg["seed"])
    if cfg.get("max_episodes") and len(eps) > cfg["max_episodes"]:
        eps = _stratified(eps, cfg["max_episodes"], rng)
    analyst = get_analyst(cfg["analyst"], cfg, store)
    if cfg["candidates"] == "discover":
        cands = analyst.discover(eps, cfg["max_candidates"], cfg["seed"])
        if not cands:
            raise UsageError("the analyst proposed no usable candidate capabilities")
    else:
        cands = load_catalog(cfg["candidates"])
        if cfg.get("capabilities"):
            cands = [c for c in cands if c.name in set(cfg["capabilities"])]
    bootstrap = cfg["resample"] == "bootstrap" or (
        cfg["resample"] == "auto" and getattr(analyst, "deterministic", False)
    )
    by_id = {e["episode_id"]: e for e in eps}
    labels = _label_runs(analyst, eps, cands, cfg, bootstrap)
    n_err = sum(1 for lb, _ in labels if lb.label == "ERROR")
    if labels and n_err > len(labels) / 2:
        # a diagnosis built on the few labels left would look like a result and be noise (issue 12)
        raise CheckFailed(
            f"diagnose: {n_err} of {len(labels)} labels are ERROR (the {cfg['analyst']} analyst gave no usable "
            "answer for most of them); no diagnosis stored",
            hint="use a stronger analyst model (analyst: openai / a larger hf model) or analyst: rules",
        )
    if n_err:
        print(
            f"warning: {n_err} of {len(labels)} labels are ERROR (the {cfg['analyst']} analyst gave no usable "
            "answer); they are left out of the counts",
            file=sys.stderr,
        )
    sel, freq, n_seeds = _select_by_agreement(cands, labels, eps, by_id, cfg, bootstrap)
    desc = {c.name: c for c in cands}
    n_fail = sum(1 for e in eps if not e["success"])
    doc = {
        "kind": "diagnosis",
        "version": 1,
        "rollouts": art.uri,
        "analyst": cfg["analyst"],
        "thresholds": {
            "coverage_min": cfg["coverage_min"],
            "delta_min": cfg["delta_min"],
            "runs": cfg["runs"],
            "min_runs": cfg["min_runs"],
            "resample": "bootstrap" if bootstrap else "none",
            "bootstrap_seeds": n_seeds,
            "agreement": cfg["agreement"],
        },
        "episodes": {"failed": n_fail, "passed": len(eps) - n_fail},
        "selected": [_entry(s, desc, cfg, freq, n_seeds) for s in sel if s.selected],
        "rejected": [_entry(s, desc, cfg, freq, n_seeds) for s in sel if not s.selected],
    }
    validate(doc, "diagnosis.v1.json", source=CAPS_FILE)
    with prepared.writer(store, "diagnosis", name=name, overrides=overrides, replace=replace) as w:
        _write_tables(w.path, doc, cands, labels, by_id, sel, cfg["analyst"])
        w.summary.update(
            {
                "selected": [d["name"] for d in doc["selected"]],
                "rejected": [d["name"] for d in doc["rejected"]],
                "episodes": len(eps),
                "failed": n_fail,
                "analyst": cfg["analyst"],
                "label_errors": n_err,
                # the share of bootstrap seeds that selected exactly this set
                "selection_set_agreement": round(freq["__set__"], 4),
                "bootstrap_seeds": n_seeds,
            }
        )

    return {"diagnosis": w.artifact}


def _label_runs(analyst, eps: list[dict[str, Any]], cands: list, cfg: Any, bootstrap: bool) -> list[tuple]:
    """(label, episode weight) of every labelling run; a deterministic analyst labels once for all runs."""
    labels = []
    fixed = analyst.label(eps, cands, 0, cfg["seed"]) if getattr(analyst, "deterministic", False) else None
    for r in range(cfg["runs"]):
        run_labels = (
            [type(lb)(lb.episode_id, lb.capability, r, lb.label, lb.rationale) for lb in fixed]
            if fixed is not None
            else analyst.label(eps, cands, r, cfg["seed"] + r)
        )
        w = _weights(eps, r, cfg["seed"], bootstrap)
        for lb in run_labels:
            labels.append((lb, w.get(lb.episode_id, 0.0)))
    return labels


def _per_run(cands, labels, eps, runs: int, seed: int, bootstrap: bool) -> dict[str, list]:
    """Capability -> its RunStats in each labelling run, episodes weighted by bootstrap seed `seed`."""
    success = {e["episode_id"]: e["success"] for e in eps}
    out: dict[str, list] = {c.name: [] for c in cands}
    for r in range(runs):
        w = _weights(eps, r, seed, bootstrap)
        for c in cands:
            rows = [
                (success[lb.episode_id], lb.label, w.get(lb.episode_id, 0.0))
                for lb, _ in labels
                if lb.capability == c.name and lb.run == r
            ]
            out[c.name].append(run_stats(rows))
    return out


def _examples(cap: str, labels, by_id) -> list[str]:
    """Task ids of failed episodes labelled LACKING for `cap`, first seen first."""
    seen: list[str] = []
    for lb, _w in labels:
        if lb.capability == cap and lb.label == "LACKING" and not by_id[lb.episode_id]["success"]:
            tid = str(by_id[lb.episode_id]["task_id"])
            if tid not in seen:
                seen.append(tid)
    return seen


def _select_by_agreement(
    cands, labels, eps, by_id, cfg, bootstrap: bool
) -> tuple[list, dict[str, float], int]:
    """The selection repeated for each bootstrap seed; a capability is kept when the share of seeds that select
    it reaches `agreement`. Returns the first seed's statistics (with the agreed choice), the shares, the seeds."""
    examples = {c.name: _examples(c.name, labels, by_id) for c in cands}
    seeds = [cfg["seed"] + b for b in range(cfg["bootstrap_seeds"] if bootstrap else 1)]
    sels = [
        select(
            _per_run(cands, labels, eps, cfg["runs"], s, bootstrap),
            rho=cfg["coverage_min"],
            delta=cfg["delta_min"],
            k=cfg["min_runs"],
            examples=examples,
        )
        for s in seeds
    ]
    freq = agreement(sels)
    agreed = {c for c, f in freq.items() if f >= cfg["agreement"] - 1e-12}
    sel = [copy.copy(s) for s in sels[0]]
    for s in sel:
        s.selected = s.capability in agreed
    sel.sort(key=lambda s: (not s.selected, -s.mean_delta, s.capability))
    freq["__set__"] = set_agreement(sels, agreed)
    return sel, freq, len(seeds)


def _entry(s, desc: dict[str, Any], cfg: Any, freq: dict[str, float], n_seeds: int) -> dict[str, Any]:
    """A capability's entry in capabilities.yaml: its numbers, and why it was not selected."""
    d = {
        "name": s.capability,
        "description": desc[s.capability].description,
        "mean_delta": round(s.mean_delta, 4),
        "std_delta": round(s.std_delta, 4),
        "mean_coverage": round(s.mean_coverage, 4),
        "std_coverage": round(s.std_coverage, 4),
        "runs_passed": s.runs_passed,
        "runs_total": len(s.runs),
        "example_failed_task_ids": s.example_failed,
        "selection_frequency": round(freq[s.capability], 4),
    }
    if desc[s.capability].distractor:
        d["distractor"] = True
    if not s.selected:
        why = []
        if s.mean_coverage < cfg["coverage_min"]:
            why.append(f"coverage {s.mean_coverage:.2f} < {cfg['coverage_min']}")
        if s.mean_delta < cfg["delta_min"]:
            why.append(f"delta {s.mean_delta:.2f} < {cfg['delta_min']}")
        why.append(f"passed {s.runs_passed}/{len(s.runs)} runs < {cfg['min_runs']}")
        why.append(
            f"selected for {freq[s.capability]:.0%} of {n_seeds} bootstrap seeds < {cfg['agreement']:.0%}"
        )
        d["reason"] = "; ".join(why)
    return d


def _write_tables(
    path, doc: dict[str, Any], cands: list, labels: list[tuple], by_id, sel, analyst: str
) -> None:
    """A diagnosis artifact's files: capabilities.yaml, candidates.yaml, the labels and per-run numbers."""
    (path / CAPS_FILE).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
    (path / CANDIDATES_FILE).write_text(
        yaml.safe_dump(
            {"kind": "capabilities", "version": 1, "capabilities": [c.to_dict() for c in cands]},
            sort_keys=False,
            allow_unicode=True,
            width=110,
        )
    )
    rows = [
        {
            "episode_id": lb.episode_id,
            "task_id": str(by_id[lb.episode_id]["task_id"]),
            "success": bool(by_id[lb.episode_id]["success"]),
            "capability": lb.capability,
            "run": lb.run,
            "label": lb.label,
            "weight": wt,
            "rationale": lb.rationale,
            "analyst": analyst,
        }
        for lb, wt in labels
    ]
    LABELS.write(rows, path, compression="zstd")
    run_rows = [
        {
            "capability": s.capability,
            "run": i,
            **{k: v for k, v in rs.to_dict().items() if k in CAPABILITY_RUNS.names},
            "passed": p,
        }
        for s in sel
        for i, (rs, p) in enumerate(zip(s.runs, s.passed, strict=True))
    ]
    CAPABILITY_RUNS.write(run_rows, path)
