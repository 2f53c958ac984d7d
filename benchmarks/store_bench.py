#!/usr/bin/env python
"""Store benchmark: `trace ingest` throughput and a GROUP BY over >= 1 M tool calls via the DuckDB index.

1. Generates a synthetic corpus shaped like the vendored τ²-bench results (examples/tau2/results_*.json):
   real simulations are sampled (weighted towards longer ones until the corpus reaches the tool-call
   target) and mutated (simulation ids, tool-call ids, task ids -> task variants with trials, seeds,
   rewards). The corpus is written twice: as τ²-bench results files (one domain per file, sharded) and as
   one JSONL file in the `trace ingest jsonl` format (schemas/episode.v1.json: OpenAI chat messages with
   `tool_calls`, string arguments, tool results with `tool_call_id` and `error`).
2. Ingest throughput (episodes/s) through the real stage entry point
   (`trace_cli.stages.base.execute("ingest", ...)`, in-process), for both formats, plus the wall time of
   one real `trace ingest` subprocess per format on the first shard's episodes.
3. `SELECT tool_name, count(*), error rate ... GROUP BY tool_name` over the tool_calls view via
   `trace_cli.store.sql.query` (median of repeats), against a plain pandas baseline that scans the same
   episodes as JSON (`pandas.read_json(lines=True)`, explode messages and tool calls, pair each call with
   its tool result by id, groupby). Both must give identical counts (checked; exit 1 if not).
4. Prints a table and writes JSON results with machine info.

Goals (issue 2): ingest >= 10 000 episodes/s; the SQL query >= 20x faster than the pandas baseline.

    python benchmarks/store_bench.py                       # full size: 100 k episodes, >= 1 M tool calls
    python benchmarks/store_bench.py --quick               # ~2 k episodes, a smoke run
    python benchmarks/store_bench.py --workdir /tmp/sb --keep   # keep (and reuse) the corpus and stores
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import pstats
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, machine, write_result

TAU2_DIR = REPO / "examples" / "tau2"
CORPUS_VERSION = 1

GOAL_INGEST_EPS = 10_000.0
GOAL_SPEEDUP = 20.0

GROUP_BY_SQL = (
    "SELECT tool_name, count(*) AS calls, sum(CAST(error AS INTEGER)) AS errors, "
    "avg(CAST(error AS DOUBLE)) AS error_rate FROM tool_calls GROUP BY tool_name ORDER BY tool_name"
)


# ----------------------------------------------------------------------------- corpus


@dataclass
class Template:
    """One real simulation, pre-serialised so that mutating it is a few string replacements."""

    top: dict[str, Any]  # the simulation without `messages`
    tau2_messages: str  # JSON of the τ²-bench messages
    jsonl_messages: str  # JSON of the same messages in OpenAI chat format
    call_ids: list[str]
    n_calls: int
    task_id: str


@dataclass
class Domain:
    name: str
    file: str
    header: dict[str, Any]  # timestamp + info of the results file
    tasks: dict[str, dict[str, Any]]
    templates: list[Template]
    success_rate: float
    agent_llm: str | None
    ref_actions: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)


def _openai_messages(sim: dict[str, Any], domain: str) -> list[dict[str, Any]]:
    """A simulation's messages in OpenAI chat format (what `trace export jsonl` writes), converted by the package
    (`trace_cli.formats`: its τ²-bench reader, then its JSONL writer), after a one-line system message."""
    from trace_cli.formats import jsonl
    from trace_cli.formats.tau2_sims import read_simulation

    problems, read = read_simulation(sim, "store_bench", {}, {}, {})
    if problems:
        raise SystemExit(f"a vendored τ²-bench simulation does not read: {problems[:3]}")
    system = {
        "role": "system",
        "content": f"You are a customer service agent for the {domain} domain. Follow the policy.",
    }
    rec = jsonl.record(
        {"episode_id": "-", "task_id": "-", "reward": 0.0, "messages": [system, *read.messages]}
    )
    return rec["messages"]


def load_domains(tau2_dir: Path) -> list[Domain]:
    files = sorted(tau2_dir.glob("results_*.json"))
    if not files:
        raise SystemExit(
            f"no τ²-bench results files in {tau2_dir} (the repository vendors them in examples/tau2)"
        )
    domains = []
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        info = doc["info"]
        name = (info.get("environment_info") or {}).get("domain_name") or f.stem
        tasks = {str(t["id"]): t for t in doc.get("tasks") or []}
        templates = []
        for s in doc["simulations"]:
            msgs = s["messages"]
            call_ids = [tc["id"] for m in msgs for tc in (m.get("tool_calls") or [])]
            top = {k: v for k, v in s.items() if k != "messages"}
            templates.append(
                Template(
                    top=top,
                    tau2_messages=json.dumps(msgs, ensure_ascii=False),
                    jsonl_messages=json.dumps(_openai_messages(s, name), ensure_ascii=False),
                    call_ids=call_ids,
                    n_calls=len(call_ids),
                    task_id=str(s["task_id"]),
                )
            )
        succ = sum(1 for s in doc["simulations"] if abs(s["reward_info"]["reward"] - 1.0) <= 1e-6)
        ref = {}
        for tid, t in tasks.items():
            acts = (t.get("evaluation_criteria") or {}).get("actions") or None
            ref[tid] = (
                [
                    {
                        "name": a.get("name"),
                        "arguments": a.get("arguments") or {},
                        "requestor": a.get("requestor"),
                    }
                    for a in acts
                ]
                if acts
                else None
            )
        domains.append(
            Domain(
                name=name,
                file=f.name,
                header={"timestamp": doc.get("timestamp"), "info": info},
                tasks=tasks,
                templates=templates,
                success_rate=succ / len(doc["simulations"]),
                agent_llm=(info.get("agent_info") or {}).get("llm"),
                ref_actions=ref,
            )
        )
    return domains


def _pick_templates(rng: random.Random, templates: list[Template], n: int, target_calls: int) -> list[int]:
    """n template indices whose tool calls sum to >= target_calls: weights ∝ n_calls**alpha, alpha the
    smallest that makes the expected mean reach the target (alpha = 0 is plain uniform sampling), then a
    deterministic top-up swapping short episodes for long ones if sampling fell short."""
    calls = [max(t.n_calls, 0) for t in templates]
    need = target_calls / n

    def mean(alpha: float) -> float:
        w = [(c + 1) ** alpha for c in calls]
        return sum(wi * c for wi, c in zip(w, calls, strict=True)) / sum(w)

    alpha = 0.0
    if mean(0.0) < need * 1.01:
        lo, hi = 0.0, 8.0
        if mean(hi) < need:
            alpha = hi
        else:
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if mean(mid) < need * 1.01 else (lo, mid)
            alpha = hi
    weights = [(c + 1) ** alpha for c in calls]
    picks = rng.choices(range(len(templates)), weights=weights, k=n)
    total = sum(calls[i] for i in picks)
    if total < target_calls:
        longest = max(range(len(templates)), key=lambda i: calls[i])
        order = sorted(range(n), key=lambda k: calls[picks[k]])
        for k in order:
            if total >= target_calls:
                break
            total += calls[longest] - calls[picks[k]]
            picks[k] = longest
    return picks


def _new_call_id(rng: random.Random) -> str:
    return f"call_{rng.getrandbits(96):024x}"


def generate_corpus(
    domains: list[Domain],
    out: Path,
    *,
    episodes: int,
    target_calls: int,
    shard_episodes: int,
    trials: int,
    seed: int,
) -> dict[str, Any]:
    """Write tau2/<domain>_<k>.json shards, episodes.jsonl (all episodes) and head.jsonl (= the first shard)."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tau2").mkdir(exist_ok=True)
    per_domain = [
        episodes // len(domains) + (1 if i < episodes % len(domains) else 0) for i in range(len(domains))
    ]
    shards: list[dict[str, Any]] = []
    total_calls = 0
    total_bytes_tau2 = 0
    t0 = time.perf_counter()
    with (
        open(out / "episodes.jsonl", "w", encoding="utf-8") as jl,
        open(out / "head.jsonl", "w", encoding="utf-8") as head,
    ):
        for dom, n_dom in zip(domains, per_domain, strict=True):
            if n_dom == 0:
                continue
            n_shards = math.ceil(n_dom / shard_episodes)
            sizes = [n_dom // n_shards + (1 if i < n_dom % n_shards else 0) for i in range(n_shards)]
            for k, n in enumerate(sizes):
                picks = _pick_templates(rng, dom.templates, n, math.ceil(target_calls * n / episodes))
                variants = max(1, round(n / (len(dom.tasks) or 1) / trials))
                plan = []
                trial_of: dict[str, int] = {}
                for i in picks:
                    tpl = dom.templates[i]
                    tid = f"{tpl.task_id}~v{rng.randrange(variants)}"
                    trial = trial_of.get(tid, 0)
                    trial_of[tid] = trial + 1
                    plan.append((tpl, tid, trial, rng.random() < dom.success_rate))
                tasks = []
                for tid in sorted(trial_of):
                    base = tid.rsplit("~v", 1)[0]
                    if base in dom.tasks:
                        t = dict(dom.tasks[base])
                        t["id"] = tid
                        tasks.append(t)
                path = out / "tau2" / f"{dom.name}_{k:02d}.json"
                shard_calls = 0
                with open(path, "w", encoding="utf-8") as f:
                    f.write(json.dumps(dom.header, ensure_ascii=False)[:-1])
                    f.write(', "tasks": ' + json.dumps(tasks, ensure_ascii=False) + ', "simulations": [\n')
                    for j, (tpl, tid, trial, success) in enumerate(plan):
                        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                        reward = 1.0 if success else 0.0
                        seed_ = rng.randrange(2**31)
                        tau_msgs, jl_msgs = tpl.tau2_messages, tpl.jsonl_messages
                        for old in tpl.call_ids:
                            new = _new_call_id(rng)
                            tau_msgs = tau_msgs.replace(old, new)
                            jl_msgs = jl_msgs.replace(old, new)
                        top = dict(tpl.top)
                        top.update(id=sid, task_id=tid, trial=trial, seed=seed_)
                        ri = dict(top["reward_info"])
                        ri["reward"] = reward
                        if isinstance(ri.get("reward_breakdown"), dict):
                            ri["reward_breakdown"] = {b: reward for b in ri["reward_breakdown"]}
                        top["reward_info"] = ri
                        sim = json.dumps(top, ensure_ascii=False)[:-1] + ', "messages": ' + tau_msgs + "}"
                        f.write(("" if j == 0 else ",\n") + sim)
                        total_bytes_tau2 += len(sim)
                        rec = {
                            "episode_id": sid,
                            "task_id": tid,
                            "domain": dom.name,
                            "trial": trial,
                            "seed": seed_,
                            "reward": reward,
                            "success": success,
                            "termination_reason": top.get("termination_reason") or "user_stop",
                            "info": {"env": "tau2", "agent_llm": dom.agent_llm},
                        }
                        acts = dom.ref_actions.get(tpl.task_id)
                        if acts:
                            rec["reference_actions"] = acts
                        line = json.dumps(rec, ensure_ascii=False)[:-1] + ', "messages": ' + jl_msgs + "}\n"
                        jl.write(line)
                        if not shards:
                            head.write(line)
                        shard_calls += tpl.n_calls
                    f.write("\n]}\n")
                total_calls += shard_calls
                shards.append(
                    {
                        "path": str(path),
                        "domain": dom.name,
                        "episodes": n,
                        "tool_calls": shard_calls,
                        "tasks": len(tasks),
                        "bytes": path.stat().st_size,
                    }
                )
    meta = {
        "version": CORPUS_VERSION,
        "episodes": episodes,
        "target_calls": target_calls,
        "shard_episodes": shard_episodes,
        "trials": trials,
        "seed": seed,
        "tool_calls": total_calls,
        "shards": shards,
        "jsonl": str(out / "episodes.jsonl"),
        "jsonl_bytes": (out / "episodes.jsonl").stat().st_size,
        "head_jsonl": str(out / "head.jsonl"),
        "head_episodes": shards[0]["episodes"],
        "tau2_bytes": sum(s["bytes"] for s in shards),
        "generate_s": round(time.perf_counter() - t0, 2),
        "sources": [d.file for d in domains],
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def corpus(args, workdir: Path) -> tuple[dict[str, Any], bool]:
    """Reuse a corpus in workdir made with the same parameters, else generate one."""
    cdir = workdir / "corpus"
    want = {
        "version": CORPUS_VERSION,
        "episodes": args.episodes,
        "target_calls": args.tool_calls_target,
        "shard_episodes": args.shard_episodes,
        "trials": args.trials,
        "seed": args.seed,
    }
    meta_p = cdir / "meta.json"
    if meta_p.is_file():
        meta = json.loads(meta_p.read_text())
        if all(meta.get(k) == v for k, v in want.items()) and all(
            Path(s["path"]).is_file() for s in meta["shards"]
        ):
            return meta, True
        shutil.rmtree(cdir)
    domains = load_domains(Path(args.tau2_dir))
    return generate_corpus(domains, cdir, **{k: v for k, v in want.items() if k != "version"}), False


# ----------------------------------------------------------------------------- measurements


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def ingest_inprocess(
    fmt: str, paths: list[str], store_dir: Path, profile: Path | None = None, gc_off: bool = False
) -> dict[str, Any]:
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    if store_dir.exists():
        shutil.rmtree(store_dir)
    store = Store(store_dir)
    per_file = []
    episodes = calls = 0
    total = total_cpu = 0.0
    for i, p in enumerate(paths):
        gc.collect()
        prof = cProfile.Profile() if (profile is not None and i == 0) else None
        if gc_off:
            gc.disable()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            if prof:
                prof.enable()
            out = execute("ingest", {"format": fmt, "path": p}, store)
            if prof:
                prof.disable()
        finally:
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            gc.enable()
        if prof:
            prof.dump_stats(str(profile))
        s = out.main.summary
        if out.skipped:
            raise RuntimeError(f"{p}: unexpectedly skipped (store not fresh?)")
        episodes += s["episodes"]
        calls += s["tool_calls"]
        total += dt
        total_cpu += cpu
        per_file.append(
            {
                "path": Path(p).name,
                "episodes": s["episodes"],
                "tool_calls": s["tool_calls"],
                "seconds": round(dt, 3),
                "cpu_s": round(cpu, 3),
                "episodes_per_s": round(s["episodes"] / dt, 1),
            }
        )
    return {
        "format": fmt,
        "files": len(paths),
        "episodes": episodes,
        "tool_calls": calls,
        "seconds": round(total, 3),
        "cpu_s": round(total_cpu, 3),  # process CPU time (all threads): robust to other load on the machine
        "episodes_per_s": round(episodes / total, 1),
        "episodes_per_cpu_s": round(episodes / total_cpu, 1),
        "tool_calls_per_s": round(calls / total, 1),
        "gc_disabled": gc_off,
        "max_rss_mib_so_far": round(_rss_mib(), 1),
        "per_file": per_file,
        "profiled": bool(profile),
    }


_LAUNCHER = """
import json, resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"cpu_s": round(r.ru_utime + r.ru_stime, 2), "max_rss_kib": r.ru_maxrss}, f)
sys.exit(rc)
"""


def ingest_subprocess(fmt: str, path: str, store_dir: Path, episodes: int) -> dict[str, Any]:
    if store_dir.exists():
        shutil.rmtree(store_dir)
    exe = Path(sys.executable).parent / "trace"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]
    cmd += ["ingest", fmt, path, "--store", str(store_dir), "--json"]
    env = dict(os.environ, TRACE_NO_PROGRESS="1")
    env.pop("TRACE_STORE", None)
    with tempfile.TemporaryDirectory() as td:
        usage = Path(td) / "usage.json"
        t0 = time.perf_counter()
        # Through a small launcher: a child forked straight from this (large) process would report this
        # process's RSS as its peak; the launcher's own children report their own.
        proc = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, str(usage), *cmd], capture_output=True, text=True, env=env
        )
        dt = time.perf_counter() - t0
        stdout, stderr = proc.stdout, proc.stderr
        ru = json.loads(usage.read_text()) if usage.is_file() else {"cpu_s": None, "max_rss_kib": 0}
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{stderr[-3000:]}")
    summary = json.loads(stdout)["summary"]
    if summary["episodes"] != episodes:
        raise RuntimeError(
            f"subprocess ingest of {path}: {summary['episodes']} episodes, expected {episodes}"
        )
    return {
        "format": fmt,
        "command": f"trace ingest {fmt} {Path(path).name} --store DIR --json",
        "episodes": episodes,
        "wall_s": round(dt, 3),
        "episodes_per_s": round(episodes / dt, 1),
        "cpu_s": ru["cpu_s"],
        "max_rss_mib": round(ru["max_rss_kib"] / 1024.0, 1),
    }


def sql_groupby(store_dir: Path, repeats: int) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    from trace_cli.store import Store
    from trace_cli.store.sql import query

    store = Store(store_dir)
    times = []
    rows: list[tuple] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _cols, rows = query(store, GROUP_BY_SQL)
        times.append(time.perf_counter() - t0)
    _, n = query(store, "SELECT count(*) FROM tool_calls")
    result = {r[0]: (int(r[1]), int(r[2])) for r in rows}
    return {
        "sql": GROUP_BY_SQL,
        "rows_scanned": int(n[0][0]),
        "groups": len(rows),
        "repeats": repeats,
        "first_s": round(times[0], 4),
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "times_s": [round(t, 4) for t in times],
    }, result


def _pandas_chunk(df) -> Any:
    import pandas as pd

    msgs = df[["episode_id", "messages"]].explode("messages", ignore_index=True)
    m = pd.DataFrame(msgs["messages"].tolist())
    m["episode_id"] = msgs["episode_id"].to_numpy()
    calls = m.loc[m["tool_calls"].notna(), ["episode_id", "tool_calls"]].explode(
        "tool_calls", ignore_index=True
    )
    calls = calls[calls["tool_calls"].notna()]
    c = pd.json_normalize(calls["tool_calls"].tolist())
    c["episode_id"] = calls["episode_id"].to_numpy()
    res = m.loc[m["role"] == "tool", ["episode_id", "tool_call_id", "error"]]
    j = c.merge(res, left_on=["episode_id", "id"], right_on=["episode_id", "tool_call_id"], how="left")
    j["error"] = j["error"].fillna(False).astype(bool)
    return j.groupby("function.name").agg(calls=("function.name", "size"), errors=("error", "sum"))


def pandas_groupby(jsonl: str, chunksize: int | None = None) -> dict[str, tuple[int, int]]:
    """What a user would write without the store: read the JSONL, explode messages and tool calls, pair each
    call with its tool result by (episode, tool_call_id), group by tool name. With `chunksize`, the file is
    read `chunksize` lines at a time and the partial counts summed (exact: an episode is one line); this
    bounds memory (the whole 100 k-episode file as one DataFrame needs > 20 GB)."""
    import pandas as pd

    if not chunksize:
        g = _pandas_chunk(pd.read_json(jsonl, lines=True, dtype=False))
    else:
        with pd.read_json(jsonl, lines=True, dtype=False, chunksize=chunksize) as reader:
            parts = [_pandas_chunk(df) for df in reader]
        g = pd.concat(parts).groupby(level=0).sum()
    return {str(k): (int(r.calls), int(r.errors)) for k, r in g.iterrows()}


def baseline(
    jsonl: str, repeats: int, chunksize: int | None
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    times = []
    result: dict[str, tuple[int, int]] = {}
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result = pandas_groupby(jsonl, chunksize)
        times.append(time.perf_counter() - t0)
        gc.collect()
    return {
        "chunksize": chunksize,
        "method": "pandas.read_json(lines=True"
        + (f", chunksize={chunksize}" if chunksize else "")
        + ") + explode messages/tool_calls + merge results by (episode, call id) + groupby",
        "repeats": repeats,
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "times_s": [round(t, 3) for t in times],
        "max_rss_mib_so_far": round(_rss_mib(), 1),
    }, result


# ----------------------------------------------------------------------------- report


def print_report(res: dict[str, Any]) -> None:
    rows = []
    c = res["corpus"]
    rows.append(
        (
            "corpus",
            f"{c['episodes']:,} episodes, {c['tool_calls']:,} tool calls",
            f"tau2 {c['tau2_bytes'] / 2**20:,.0f} MiB in {len(c['shards'])} files; jsonl {c['jsonl_bytes'] / 2**20:,.0f} MiB",
            "",
        )
    )
    for fmt in ("tau2", "jsonl"):
        r = res["ingest"][fmt]
        ok = r["episodes_per_s"] >= GOAL_INGEST_EPS
        rows.append(
            (
                f"ingest {fmt} (in-process)",
                f"{r['episodes_per_s']:,.0f} episodes/s",
                f"{r['episodes']:,} eps in {r['seconds']:.1f} s, {r['files']} file(s); "
                f"{r['episodes_per_cpu_s']:,.0f} eps per CPU-s",
                f"{'OK' if ok else 'MISS'} (>= {GOAL_INGEST_EPS:,.0f})",
            )
        )
    for fmt, r in (res.get("ingest_gc_off") or {}).items():
        rows.append(
            (
                f"ingest {fmt}, gc disabled (experiment)",
                f"{r['episodes_per_s']:,.0f} episodes/s",
                f"{r['seconds']:.1f} s; {r['episodes_per_cpu_s']:,.0f} eps per CPU-s",
                "",
            )
        )
    for r in res.get("subprocess", []):
        rows.append(
            (
                f"trace ingest {r['format']} (subprocess)",
                f"{r['episodes_per_s']:,.0f} episodes/s",
                f"{r['episodes']:,} eps, wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.1f} s, "
                f"peak RSS {r['max_rss_mib']:,.0f} MiB",
                "",
            )
        )
    q, b = res["query"]["sql"], res["query"]["baseline"]
    rows.append(
        (
            "GROUP BY tool_name via index",
            f"{q['median_s'] * 1000:,.1f} ms (median)",
            f"{q['rows_scanned']:,} rows, {q['groups']} groups, first {q['first_s'] * 1000:.1f} ms",
            "",
        )
    )
    rows.append(
        (
            "same with pandas over JSONL",
            f"{b['median_s']:,.2f} s (median)",
            f"{b['repeats']} repeat(s), chunks of {b['chunksize'] or 'all'} lines",
            "",
        )
    )
    sp = res["query"]["speedup"]
    rows.append(
        (
            "speed-up SQL vs pandas",
            f"{sp:,.0f}x",
            f"results identical: {res['query']['results_equal']}",
            f"{'OK' if sp >= GOAL_SPEEDUP else 'MISS'} (>= {GOAL_SPEEDUP:.0f}x)",
        )
    )
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title="trace store benchmark", header_style="bold")
        for col in ("measure", "result", "detail", "goal"):
            t.add_column(col)
        for r in rows:
            t.add_row(*r)
        Console(width=None if sys.stdout.isatty() else 160).print(t)
    except ImportError:  # pragma: no cover
        for r in rows:
            print(" | ".join(r))


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--episodes", type=int, default=None, help="episodes in the corpus (default 100000; --quick: 2000)"
    )
    p.add_argument(
        "--tool-calls-target",
        type=int,
        default=None,
        help="minimum tool calls in the corpus (default: 1000000 at 100 k episodes, else 10 per episode)",
    )
    p.add_argument("--out", default=str(RESULTS / "store_bench.json"), help="JSON results path")
    p.add_argument("--quick", action="store_true", help="small smoke run (2000 episodes unless --episodes)")
    p.add_argument("--shard-episodes", type=int, default=20_000, help="episodes per τ²-bench results file")
    p.add_argument("--trials", type=int, default=8, help="average trials per synthetic task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=7, help="repeats of the SQL query (median reported)")
    p.add_argument("--baseline-repeats", type=int, default=3, help="repeats of the pandas baseline")
    p.add_argument(
        "--baseline-chunksize",
        type=int,
        default=5000,
        help="pandas reads the JSONL this many lines at a time (0: all at once; needs > 20 GB at full size)",
    )
    p.add_argument(
        "--experiment-gc-off",
        action="store_true",
        help="also time the in-process ingests with the cyclic GC disabled (evidence for a fix)",
    )
    p.add_argument(
        "--workdir",
        help="corpus + stores here (default: a temp dir, removed at the end unless --keep); "
        "a corpus made with the same parameters is reused",
    )
    p.add_argument("--keep", action="store_true", help="keep the workdir")
    p.add_argument("--no-subprocess", action="store_true", help="skip the `trace ingest` subprocess runs")
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the first in-process ingest of each format; stats next to --out (skews that timing)",
    )
    p.add_argument("--generate-only", action="store_true", help="only write the corpus (use with --workdir)")
    p.add_argument("--strict", action="store_true", help="exit 3 when a goal is missed")
    p.add_argument(
        "--tau2-dir",
        default=str(TAU2_DIR),
        help="τ²-bench results files (default: the vendored examples/tau2)",
    )
    a = p.parse_args(argv)
    if a.episodes is None:
        a.episodes = 2000 if a.quick else 100_000
    if a.quick:
        a.repeats = min(a.repeats, 3)
        a.baseline_repeats = min(a.baseline_repeats, 1)
    if a.tool_calls_target is None:
        a.tool_calls_target = 1_000_000 if a.episodes == 100_000 else 10 * a.episodes
    if a.episodes < 1:
        p.error("--episodes must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TRACE_NO_PROGRESS"] = "1"  # same code path whether or not stderr is a terminal
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_owned = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="store_bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(f"[store_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        log(f"corpus: {args.episodes:,} episodes, >= {args.tool_calls_target:,} tool calls in {workdir}")
        meta, reused = corpus(args, workdir)
        how = "reused" if reused else f"generated in {meta['generate_s']:.1f} s"
        log(
            f"corpus {how}: {meta['tool_calls']:,} tool calls, "
            f"tau2 {meta['tau2_bytes'] / 2**20:,.0f} MiB, jsonl {meta['jsonl_bytes'] / 2**20:,.0f} MiB"
        )
        if args.generate_only:
            print(json.dumps({k: v for k, v in meta.items() if k != "shards"}, indent=2))
            return 0
        res: dict[str, Any] = {
            "benchmark": "store_bench",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine("duckdb", "pyarrow", "pandas", "trace_cli"),
            "params": {k: v for k, v in vars(args).items() if k not in ("out", "workdir", "keep")},
            "corpus": {**meta, "reused": reused},
            "goals": {"ingest_episodes_per_s": GOAL_INGEST_EPS, "sql_speedup": GOAL_SPEEDUP},
        }
        prof = {
            fmt: (out.with_name(out.stem + f".{fmt}.prof") if args.profile else None)
            for fmt in ("tau2", "jsonl")
        }
        res["ingest"] = {}
        log("ingest tau2 (in-process) ...")
        res["ingest"]["tau2"] = ingest_inprocess(
            "tau2", [s["path"] for s in meta["shards"]], workdir / "store_tau2", prof["tau2"]
        )
        log(
            f"  {res['ingest']['tau2']['episodes_per_s']:,.0f} episodes/s ({res['ingest']['tau2']['episodes_per_cpu_s']:,.0f} per CPU-second)"
        )
        gc.collect()
        log("ingest jsonl (in-process) ...")
        res["ingest"]["jsonl"] = ingest_inprocess(
            "jsonl", [meta["jsonl"]], workdir / "store_jsonl", prof["jsonl"]
        )
        log(
            f"  {res['ingest']['jsonl']['episodes_per_s']:,.0f} episodes/s ({res['ingest']['jsonl']['episodes_per_cpu_s']:,.0f} per CPU-second)"
        )
        gc.collect()
        if args.experiment_gc_off:
            res["ingest_gc_off"] = {}
            for fmt, paths in (("tau2", [s["path"] for s in meta["shards"]]), ("jsonl", [meta["jsonl"]])):
                log(f"ingest {fmt} (in-process, experiment: gc disabled) ...")
                r = ingest_inprocess(fmt, paths, workdir / f"store_{fmt}_gcoff", gc_off=True)
                shutil.rmtree(workdir / f"store_{fmt}_gcoff", ignore_errors=True)
                res["ingest_gc_off"][fmt] = r
                log(
                    f"  {r['episodes_per_s']:,.0f} episodes/s ({r['episodes_per_cpu_s']:,.0f} per CPU-second)"
                )
                gc.collect()
        for fmt in ("tau2", "jsonl"):
            if res["ingest"][fmt]["tool_calls"] != meta["tool_calls"]:
                raise AssertionError(
                    f"{fmt} ingest: {res['ingest'][fmt]['tool_calls']} tool calls, corpus has {meta['tool_calls']}"
                )
            if res["ingest"][fmt]["episodes"] != meta["episodes"]:
                raise AssertionError(
                    f"{fmt} ingest: {res['ingest'][fmt]['episodes']} episodes, corpus has {meta['episodes']}"
                )
        if args.profile:
            for fmt, p in prof.items():
                buf = io.StringIO()
                pstats.Stats(str(p), stream=buf).sort_stats("tottime").print_stats(25)
                p.with_suffix(".txt").write_text(buf.getvalue())
                log(f"profile of the first {fmt} ingest: {p} (top functions in {p.with_suffix('.txt')})")
        res["subprocess"] = []
        if not args.no_subprocess:
            n0 = meta["head_episodes"]
            log(f"trace ingest tau2/jsonl (subprocess, {n0:,} episodes each) ...")
            res["subprocess"].append(
                ingest_subprocess("tau2", meta["shards"][0]["path"], workdir / "store_sub_tau2", n0)
            )
            res["subprocess"].append(
                ingest_subprocess("jsonl", meta["head_jsonl"], workdir / "store_sub_jsonl", n0)
            )
            for d in ("store_sub_tau2", "store_sub_jsonl"):
                shutil.rmtree(workdir / d, ignore_errors=True)
        log(f"GROUP BY via the index x{args.repeats} ...")
        q, sql_result = sql_groupby(workdir / "store_jsonl", args.repeats)
        _, sql_result_tau2 = sql_groupby(workdir / "store_tau2", 1)
        log(f"  median {q['median_s'] * 1000:.1f} ms; pandas baseline x{args.baseline_repeats} ...")
        b, pd_result = baseline(meta["jsonl"], args.baseline_repeats, args.baseline_chunksize or None)
        log(f"  median {b['median_s']:.2f} s")
        equal = sql_result == pd_result
        equal_tau2 = sql_result_tau2 == sql_result
        n_sql = sum(v[0] for v in sql_result.values())
        res["query"] = {
            "sql": q,
            "baseline": b,
            "speedup": round(b["median_s"] / q["median_s"], 1),
            "results_equal": equal,
            "tau2_store_equal": equal_tau2,
            "tool_calls_counted": n_sql,
            "result": {k: {"calls": v[0], "errors": v[1]} for k, v in sorted(sql_result.items())},
        }
        res["goals_met"] = {
            "ingest_tau2": res["ingest"]["tau2"]["episodes_per_s"] >= GOAL_INGEST_EPS,
            "ingest_jsonl": res["ingest"]["jsonl"]["episodes_per_s"] >= GOAL_INGEST_EPS,
            "sql_speedup": res["query"]["speedup"] >= GOAL_SPEEDUP,
            "tool_calls_at_least_target": n_sql >= args.tool_calls_target,
        }
        write_result(out, res)
        print_report(res)
        print(f"results: {out}")
        if not equal or not equal_tau2:
            diff = sorted(set(sql_result.items()) ^ set(pd_result.items()))[:10]
            print(
                f"ERROR: the SQL and pandas results differ (sql==pandas: {equal}, tau2==jsonl: {equal_tau2}): {diff}",
                file=sys.stderr,
            )
            return 1
        if args.strict and not all(res["goals_met"].values()):
            return 3
        return 0
    finally:
        if tmp_owned and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep or not tmp_owned:
            log(f"workdir kept: {workdir}")


if __name__ == "__main__":
    sys.exit(main())
