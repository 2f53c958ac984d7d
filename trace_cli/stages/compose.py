"""Stage `compose`: combine per-capability LoRA adapters (same base) into a `composition` artifact.

`router` (the paper) records experts and settings; `moe` (ours) trains token-level top-1 gates on transcripts
labelled per assistant turn (`compose.moe_data`: by default each expert's own GRPO training episodes and the
base's diagnosed target conversations, no new rollouts) and reports routing accuracy per held-out turn, per slot
(in the composition's `moe` section; on the agent's own conversations with `moe.test_rollouts`); `merge` saves
PEFT's linear merge. Every check
(adapters exist, share the base, are at least two for a merge, gates fit the base) runs in `prepare`, before
anything is written. The base is always a slot of router and moe (label A / slot 0), so they take one adapter:
a composition then uses it only where it is chosen over the base. The artifact holds copies of the adapters, so it stays usable when they are collected.
"""

from __future__ import annotations

import shutil
import sys
from typing import Any

from trace_cli.compose import METHODS
from trace_cli.errors import UsageError
from trace_cli.errors import a as article
from trace_cli.stages.base import Prepared, checked_config
from trace_cli.store import Artifact, Store
from trace_cli.store.tables import GATE_METRICS

NAME = "compose"
OUTPUTS = {"composition": "composition"}
METHOD_KEYS = METHODS  # the methods are named once, in trace_cli.compose
NEEDS = "needs"  # moe.data's expert for target transcripts labelled per turn by what each one needs


def _recorded_base(art) -> str | None:
    return next((i.get("digest") for i in art.manifest.get("inputs", []) if i.get("role") == "model"), None)


def _adapters(cfg: dict[str, Any], store: Store) -> list[dict[str, Any]]:
    refs = cfg["adapters"]
    if len(refs) < 2 and cfg["method"] == "merge":
        raise UsageError(
            f"a merge needs at least two adapters, got one ({refs[0]}); router and moe take one (the base is "
            f"always a slot: they choose between the base and it), or evaluate it directly: trace eval --model "
            f"{refs[0]}"
        )
    if len(set(refs)) != len(refs):
        raise UsageError(f"--adapter: the same adapter is given twice ({', '.join(refs)})")
    out = []
    for ref in refs:
        art = store.resolve(ref, kind="adapter")  # NotFoundError (exit 2) names the unknown adapter
        if not (art.path / "adapter" / "adapter_config.json").is_file():
            raise UsageError(f"adapter {ref}: {art.uri} has no adapter/adapter_config.json")
        cap = (
            art.summary.get("capability")
            or art.config.get("capability")
            or (store.names_of("adapter", art.id) or [art.id])[0]
        )
        out.append(
            {
                "ref": ref,
                "art": art,
                "name": str(cap),
                "env": art.config.get("env"),
                "base": _recorded_base(art),
            }
        )
    seen: dict[str, str] = {}
    for a in out:
        if a["name"] in seen:
            raise UsageError(
                f"adapters {seen[a['name']]} and {a['ref']} are both for capability {a['name']!r}; compose one "
                "adapter per capability"
            )
        seen[a["name"]] = a["ref"]
    bases = {a["base"] for a in out}
    if len(bases) > 1:
        listing = ", ".join(f"{a['ref']} (base {str(a['base'])[:12]}…)" for a in out)
        raise UsageError(
            f"adapters on different base models: {listing}; compose only adapters trained on the same base"
        )
    return out


def prepare(config: dict[str, Any], store: Store) -> Prepared:
    from trace_cli.compose.spec import describe
    from trace_cli.models.refs import adapter_base, resolve_model

    cfg = checked_config(NAME, config)
    for k in METHOD_KEYS:
        if k != cfg["method"] and (config or {}).get(k):
            raise UsageError(f"{k}: only used by method {k} (method is {cfg['method']})")
    adapters = _adapters(cfg, store)
    if cfg.get("base"):
        base = resolve_model(cfg["base"], store)
        if base.kind != "hf":
            raise UsageError(
                f"--base {cfg['base']!r}: the base must be a model (store://model/NAME or an HF dir), not {article(base.kind)}"
            )
    else:
        base = adapter_base(adapters[0]["art"], store)
    wrong = [a["ref"] for a in adapters if a["base"] != base.digest]
    if wrong:
        raise UsageError(
            f"adapter(s) {', '.join(wrong)} were trained on another base model than {base.display} "
            f"(digest {base.digest[:12]}…); pass the base they were trained on, or drop --base"
        )
    for a in adapters:
        a["description"] = cfg["descriptions"].get(a["name"]) or describe(a["name"], a["env"], store)
    unknown = sorted(set(cfg["descriptions"]) - {a["name"] for a in adapters})
    if unknown:
        raise UsageError(
            f"descriptions: no adapter for {', '.join(unknown)} (capabilities: {', '.join(a['name'] for a in adapters)})"
        )
    inputs = [base.as_input("model")] + [a["art"].as_input(f"adapter:{a['name']}") for a in adapters]
    extra: dict[str, Any] = {"base": base, "adapters": adapters}
    method = cfg["method"]
    for k in METHOD_KEYS:
        if k != method:
            cfg.pop(k, None)
    if method == "router":
        from transformers import AutoTokenizer

        from trace_cli.compose.router import label_ids

        label_ids(AutoTokenizer.from_pretrained(base.path), len(adapters) + 1)
    elif method == "merge":
        w = cfg["merge"]["weights"]
        if w is not None and len(w) != len(adapters):
            raise UsageError(f"merge.weights: {len(w)} weight(s) for {len(adapters)} adapters")
    else:
        inputs += _prepare_moe(cfg, store, adapters, base, extra)
    id_config = {**cfg, "base": base.digest, "adapters": [a["art"].digest for a in adapters]}
    p = Prepared(NAME, cfg, id_config, inputs, dict(OUTPUTS)).finalize()
    p.extra.update(extra)
    return p


def _prepare_moe(cfg, store: Store, adapters, base, extra) -> list[dict[str, Any]]:
    from trace_cli.config.seeds import parse_seeds
    from trace_cli.envs.registry import make_env
    from trace_cli.models.refs import resolve_model

    m = cfg["moe"]
    names = [a["name"] for a in adapters]
    inputs: list[dict[str, Any]] = []
    if m.get("gates"):
        from trace_cli.compose.moe import check_gates, read_gates
        from trace_cli.compose.spec import read_composition

        g = store.resolve(m["gates"], kind="composition")
        doc = read_composition(g.path)
        if doc["method"] != "moe":
            raise UsageError(f"moe.gates: {g.uri} is {article(doc['method'])} composition; it has no gates")
        _, meta = read_gates(g.path / doc["gates"]["file"])
        check_gates(meta, base_digest=base.digest, experts=names, origin=f"moe.gates ({g.uri})")
        if doc["gates"]["context"] != m["context"]:
            raise UsageError(
                f"moe.gates: {g.uri} has context={doc['gates']['context']}; set moe.context to match"
            )
        extra["gates"] = g
        return [g.as_input("gates")]
    data = []
    for i, d in enumerate(m["data"]):
        if d["expert"] not in ("base", NEEDS) and d["expert"] not in names:
            raise UsageError(
                f"moe.data[{i}].expert: {d['expert']!r} is not 'base', {NEEDS!r} or one of {', '.join(names)}"
            )
        art = store.resolve(d["rollouts"], kind="rollouts")
        data.append({**d, "art": art})
        inputs.append(art.as_input(f"data:{d['expert']}"))
    if m.get("diagnosis"):
        from trace_cli.compose.needs import diagnosed_rollouts

        diag = store.resolve(m["diagnosis"], kind="diagnosis")
        rollouts = diagnosed_rollouts(diag, store)
        if rollouts is None:
            raise UsageError(f"moe.diagnosis: {diag.uri} records no rollouts it diagnosed")
        extra["diagnosis"] = (diag, rollouts)
        inputs.append(diag.as_input("diagnosis"))
    if m.get("test_rollouts"):
        test = store.resolve(m["test_rollouts"], kind="rollouts")
        extra["test_rollouts"] = test
        inputs.append(test.as_input("test_rollouts"))
    if not data:  # the adapters' own episodes; generated only what they and a diagnosis cannot give
        from trace_cli.compose.moe_data import has_episodes

        seeds = parse_seeds(m["seeds"])
        for a in adapters:
            if a["env"] is None and not has_episodes(a["art"]):
                raise UsageError(
                    f"adapter {a['ref']} records no environment and kept no training episodes; give moe.data "
                    "(rollouts labelled with experts)"
                )
            if not has_episodes(a["art"]):
                make_env(a["env"], store=store)
        make_env(m["target"], store=store)
        policy = resolve_model(m["policy"], store)
        inputs.append(policy.as_input("data_policy"))
        extra.update(policy=policy, seeds=seeds)
    labelled = {d["expert"] for d in data}
    if data and NEEDS not in labelled and "diagnosis" not in extra and not labelled >= set(names) | {"base"}:
        missing = sorted((set(names) | {"base"}) - labelled)
        raise UsageError(
            f"moe.data: no transcripts for {', '.join(missing)}; every expert and 'base' needs some "
            f"(or give target transcripts labelled by need: expert {NEEDS!r}, or moe.diagnosis)"
        )
    extra["data"] = data
    return inputs


def run(prepared: Prepared, store: Store, *, name=None, overrides=None, replace=False) -> dict[str, Artifact]:
    from trace_cli.compose import GATES_FILE, MERGED_DIR
    from trace_cli.compose.router import LABELS
    from trace_cli.compose.spec import EXPERTS_DIR, write_composition

    cfg = prepared.config
    base = prepared.extra["base"]
    adapters = prepared.extra["adapters"]
    method = cfg["method"]
    with prepared.writer(store, "composition", name=name, overrides=overrides, replace=replace) as w:
        experts = []
        for i, a in enumerate(adapters, start=1):
            rel = f"{EXPERTS_DIR}/{a['name']}"
            shutil.copytree(a["art"].path / "adapter", w.path / rel)
            e = {
                "name": a["name"],
                "description": a["description"],
                "adapter": a["art"].uri,
                "adapter_digest": a["art"].digest,
                "env": a["env"],
                "dir": rel,
            }
            if method == "router":
                e["label"] = LABELS[i]  # A is "base"
            if method == "moe":
                e["slot"] = i  # slot 0 is "base"
            experts.append(e)
        doc: dict[str, Any] = {
            "kind": "composition",
            "version": 1,
            "method": method,
            "base": {
                "ref": cfg.get("base") or base.display,
                "uri": f"store://model/{base.artifact_id}" if base.artifact_id else None,
                "digest": base.digest,
            },
            "experts": experts,
            "settings": {method: cfg[method]},
        }
        summary: dict[str, Any] = {
            "method": method,
            "experts": [a["name"] for a in adapters],
            "n_experts": len(adapters),
            "base_model": cfg.get("base") or base.display,
            "base_model_uri": doc["base"]["uri"],
            "base_model_path": str(base.path),
        }
        if method == "merge":
            from trace_cli.compose.merge import merge_adapters

            weights = cfg["merge"]["weights"] or [1.0 / len(adapters)] * len(adapters)
            merge_adapters(
                base.path,
                [(e["name"], w.path / e["dir"]) for e in experts],
                weights,
                cfg["merge"]["combination_type"],
                w.path / MERGED_DIR,
            )
            doc["merged"] = MERGED_DIR
            summary.update(combination_type=cfg["merge"]["combination_type"], weights=weights)
        elif method == "router":
            r = cfg["router"]
            summary.update(
                strategy=r["strategy"], top_p=r["top_p"], reroute=r["reroute"], history=r["history"]
            )
            doc["targets"] = _targets(base, w.path, experts)
        else:
            summary.update(_run_moe(prepared, store, w.path, doc, experts, GATES_FILE))
        write_composition(w.path, doc)
        w.summary.update(summary)
    return {"composition": w.artifact}


def _targets(base, path, experts) -> list[str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_cli.compose.adapters import check_targets, load_lora

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base.path))
    return check_targets(model, [load_lora(path / e["dir"], e["name"]) for e in experts])


def _transcripts(prepared: Prepared, store: Store, names: list[str]):
    """The gates' labelled transcripts (`compose.moe_data` says from where) and how many were generated."""
    from trace_cli.compose import moe_data

    ex = prepared.extra
    slot = {"base": 0, **{n: i for i, n in enumerate(names, start=1)}}
    out = moe_data.from_data(ex["data"], slot, names)
    if "diagnosis" in ex:
        out += moe_data.from_diagnosis(*ex["diagnosis"], names)
    if "policy" not in ex:  # moe.data given: nothing else, nothing generated
        return out, 0
    envs = []
    for a in ex["adapters"]:
        if moe_data.has_episodes(a["art"]):
            out += moe_data.from_training(a["art"], slot[a["name"]])
        else:
            envs.append((slot[a["name"]], a["env"]))
    m = prepared.config["moe"]
    if "diagnosis" not in ex:  # else the diagnosed conversations are the target's transcripts
        envs.insert(0, (0, m["target"]))
    if not envs:
        return out, 0
    from trace_cli.compose.policy import load_policy
    from trace_cli.config.sampling import SamplingSettings

    sampling = SamplingSettings.of(m).policy_kwargs()
    policy = load_policy(ex["policy"], **sampling, seed=prepared.config["seed"])
    jobs = [(s, 0) for s in ex["seeds"]]
    made = moe_data.generated(policy, store, jobs, m["max_turns"], envs, names)
    return out + made, len(jobs) * len(envs)


def _test_transcripts(prepared: Prepared, names: list[str]):
    """The agent's own held-out conversations (moe.test_rollouts), labelled per turn by need."""
    from trace_cli.compose.moe_data import by_need_per_turn
    from trace_cli.store.rollouts import read_episodes

    art = prepared.extra["test_rollouts"]
    return by_need_per_turn(read_episodes(art.path), names, art.id)


def _run_moe(prepared: Prepared, store: Store, path, doc, experts, gates_file: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.compose.adapters import check_targets, load_lora
    from trace_cli.compose.moe import attach, load_gates, save_gates
    from trace_cli.compose.moe_train import routing_accuracy, train_gates
    from trace_cli.models import device

    cfg, m, base = prepared.config, prepared.config["moe"], prepared.extra["base"]
    names = [e["name"] for e in experts]
    tok = AutoTokenizer.from_pretrained(base.path)
    model = device.place(AutoModelForCausalLM.from_pretrained(base.path, dtype=device.dtype()))
    loras = [load_lora(path / e["dir"], e["name"]) for e in experts]
    targets = check_targets(model, loras)
    layers, trace = attach(
        model, loras, targets, context=m["context"], horizon=m["context_tokens"], pad_id=tok.pad_token_id
    )
    n_slots = len(names) + 1
    summary: dict[str, Any] = {
        "gated_layers": len(layers),
        "gate_parameters": sum(x.gate.weight.numel() for x in layers.values()),
    }
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if "gates" in prepared.extra:
        g = prepared.extra["gates"]
        load_gates(layers, g.path / gates_file, base_digest=base.digest, experts=names, origin=g.uri)
        summary["gates_from"] = g.uri
    else:
        train, test, counts = _gate_examples(prepared, store, tok, names, summary)

        def log(r):
            if r["step"] % 20 == 0 or r["step"] == m["steps"]:
                print(
                    f"gates step {r['step']:>5}/{m['steps']}  loss {r['loss']:.4f}  token acc {r['token_accuracy']:.3f}",
                    file=sys.stderr,
                )

        rows = train_gates(
            model,
            layers,
            trace,
            train,
            n_slots=n_slots,
            steps=m["steps"],
            lr=m["learning_rate"],
            batch_size=m["batch_size"],
            aux_coef=m["aux_loss_coef"],
            seed=cfg["seed"],
            pad_id=pad,
            log=log,
        )
        GATE_METRICS.write(rows, path)
        summary.update(
            transcripts=counts,
            train_episodes=len(train),
            held_out_episodes=len(test),
            steps=len(rows),
            final_loss=round(rows[-1]["loss"], 4) if rows else None,
            train_s=round(rows[-1]["elapsed_s"], 1) if rows else 0.0,
        )
        summary.update(
            routing_accuracy(model, trace, test, n_slots=n_slots, names=["base"] + names, pad_id=pad)
        )
        from trace_cli.compose.moe_data import routing_report

        doc["moe"] = routing_report(summary)
    save_gates(path / gates_file, layers, base_digest=base.digest, experts=names)
    doc["targets"] = targets
    doc["gates"] = {
        "file": gates_file,
        "context": m["context"],
        "horizon": float(m["context_tokens"]),
        "slots": ["base"] + names,
    }
    return summary


def _gate_examples(prepared: Prepared, store: Store, tok, names: list[str], summary: dict[str, Any]):
    """(train, test, transcripts per slot) of the gates: labelled transcripts, held out or tested on the agent's
    own conversations (their counts go in `summary`); too few for a slot is a UsageError."""
    from trace_cli.compose.moe_train import build_examples, split

    m = prepared.config["moe"]
    transcripts, summary["generated_episodes"] = _transcripts(prepared, store, names)
    test = []
    counts = {n: sum(1 for t in transcripts if s in t.turn_labels()) for s, n in enumerate(["base"] + names)}
    empty = [n for n, c in counts.items() if c < 2]
    if empty:
        raise UsageError(
            f"moe: too few transcripts to train and test the gates for {', '.join(empty)} "
            f"(per expert: {counts}); widen moe.seeds or give moe.data",
            hint="successful rollouts count for experts",
        )
    examples = build_examples(tok, transcripts, m["max_length"])
    if "test_rollouts" in prepared.extra:  # every transcript trains; the agent's own conversations test
        train = examples
        test = build_examples(tok, _test_transcripts(prepared, names), m["max_length"])
        summary["routing_test_episodes"] = {
            n: sum(1 for e in test if s in e.labels) for s, n in enumerate(["base"] + names)
        }
    else:
        train, test = split(examples, m["held_out"], prepared.config["seed"], m["held_out_min"])
    return train, test, counts
