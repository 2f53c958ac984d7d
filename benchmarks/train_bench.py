#!/usr/bin/env python
"""Train benchmark: `trace train --method grpo` against a bare TRL `GRPOTrainer` script, same model/env/config.

Both sides run the same workload so the ratio measures what our trainer adds (the shared rollout loop, the
token-history policy, seed prompts, constant-group dropping, checkpoint-free bookkeeping, the artifact):
  * model: an offline Qwen3-architecture model (`trace model init --preset tiny|small`), LoRA on all linears;
  * env: `shop`, single-turn (`max_turns 1`): the bare script has no multi-turn loop of ours, so each episode is
    one generation of up to `--tokens` tokens from the rendered first prompt, scored by the env's verifier after
    applying the parsed action (the same reward on both sides);
  * GRPOConfig: identical group size, batch, learning rate, sampling, loss (dapo), beta 0, fp32 on CPU.
Each side runs in its own subprocess (same threads, fresh memory), alternating, `--repeats` times; the timed
part is TRL's `train_runtime` on both sides (model load and imports excluded); `trace train` also reports its
end-to-end wall time. A multi-turn `trace train` run (`--multi-turn-turns`) is reported for reference only.

Metrics: optimizer steps/s = steps / train_runtime; rollout tokens/s = generated (model) tokens / train_runtime,
with generated tokens = sum over steps of `completions/mean_length` x episodes per step. Goal: >= 0.95x bare TRL.

    python benchmarks/train_bench.py                    # tiny model, 3 repeats
    python benchmarks/train_bench.py --preset small --steps 4 --repeats 2
    python benchmarks/train_bench.py --quick            # smoke run

`--model smollm2`: GRPO on the real offline model (SmolLM2-135M-Instruct, imported with `trace model import`),
today's path against the current one, side by side in one run: one optimizer step over `--episodes` multi-turn
shop episodes (groups of `--num-generations`, up to `--tokens` tokens a turn, 1,024 a conversation), each side in
its own subprocess. "before" is the trainer as of `--before-ref` (exported with `git archive`; default: the
commit before issue 26's speed work) with the settings the SmolLM2 end-to-end run used (2 episodes per
micro-step, gradient checkpointing on: 4 or more OOMed at 24 GB); "after" is this checkout (one group per
micro-step, no checkpointing). Reported: wall and process-CPU seconds per episode, split into rollout and
training, episode tokens, peak memory. Goal (issue 26): <= 10 s per shop-length episode.

    OMP_NUM_THREADS=1 python benchmarks/train_bench.py --model smollm2 --episodes 8     # ~40 min, mostly "before"
    OMP_NUM_THREADS=2 python benchmarks/train_bench.py --model smollm2 --episodes 8 --threads 2
On a CPU shared with other jobs, 2 threads spin and wait for each other: measured 2026-12-04 at load 5 on 2 cores,
"before" took 232 s/episode wall (179 cpu-s) with 2 threads against ~91 cpu-s with one; compare cpu-s there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, machine, write_result

GOAL = 0.95
# the last commit before issue 26's GRPO speed work (the "before" side of --model smollm2)
BEFORE_REF = "8b395d1"
SMOL_GOAL_S = 10.0  # issue 26: seconds per shop-length episode
KEYS = (
    "steps_per_s",
    "tokens_per_s",
    "steady_steps_per_s",
    "steady_tokens_per_s",
    "cpu_steps_per_s",
    "cpu_tokens_per_s",
)
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TRACE_NO_PROGRESS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["tiny", "small"], default="tiny")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per run")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument(
        "--batch", type=int, default=16, help="episodes per step (per_device_batch_size, 1 process)"
    )
    p.add_argument("--tokens", type=int, default=48, help="max tokens per episode (max_new_tokens = budget)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--multi-turn-turns", type=int, default=4, help="0 = skip the multi-turn reference run")
    # one torch thread per worker by default: steadier timings on a shared machine
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="1 repeat, 2 steps, small batch")
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default=str(RESULTS / "train_bench.json"))
    p.add_argument(
        "--model",
        choices=["preset", "smollm2"],
        default="preset",
        help="preset: the from-scratch --preset model against bare TRL; smollm2: the real model, before vs after",
    )
    p.add_argument("--episodes", type=int, default=4, help="[smollm2] episodes in the measured step")
    p.add_argument(
        "--before-ref", default=BEFORE_REF, help="[smollm2] git ref of today's trainer ('none' to skip it)"
    )
    p.add_argument("--worker", choices=["bare", "grpo"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.steps, a.batch, a.num_generations, a.tokens = 1, 2, 8, 4, 16
        a.multi_turn_turns = min(a.multi_turn_turns, 2)
        a.episodes = min(a.episodes, 2)
    if a.model == "smollm2":
        if "--tokens" not in (argv if argv is not None else sys.argv):
            a.tokens = 128  # a turn's max_new_tokens, as the SmolLM2 end-to-end run
        if "--num-generations" not in (argv if argv is not None else sys.argv):
            a.num_generations = min(4, a.episodes)
        if a.episodes % a.num_generations:
            p.error("--episodes must be a multiple of --num-generations")
    return a


# ----------------------------------------------------------------------------- bare TRL worker
def bare_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """A plain TRL GRPOTrainer script: string prompts (the env's first prompt rendered with the tokenizer's own
    chat template), one reward function that applies the parsed completion to the env and returns its verifier's
    reward. No trace_cli trainer code is involved (only the env and the completion parser, for the reward)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from trace_cli.envs.registry import make_env
    from trace_cli.models.chat import parse_assistant

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    tok = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    env = make_env(spec["env"])
    rows = []
    for s in range(spec["seed_lo"], spec["seed_hi"]):
        obs = env.reset(s)
        msgs = [{"role": "system", "content": obs.system_prompt}] + [dict(m) for m in obs.messages]
        text = tok.apply_chat_template(
            msgs, tools=obs.tools, add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        rows.append({"prompt": text, "seed": s})

    def env_reward(prompts, completions, seed, **kw):
        out = []
        for text, sd in zip(completions, seed, strict=True):
            e = make_env(spec["env"])
            e.reset(sd)
            actions = parse_assistant(text)
            a = actions[0]
            if "malformed" not in a:
                e.step(a if "name" in a else {"content": a.get("content", "")})
            out.append(float(e.verify().reward))
        return out

    args = GRPOConfig(
        output_dir=spec["out"],
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["batch"],
        gradient_accumulation_steps=1,
        num_generations=spec["num_generations"],
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        max_completion_length=spec["tokens"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        log_level="warning",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=LoraConfig(
            r=16, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    cpu0 = time.process_time()
    out = trainer.train()
    cpu_s = time.process_time() - cpu0
    hist = [h for h in trainer.state.log_history if "reward" in h]
    per_step = [
        {
            "step": h["step"],
            "step_time": h["step_time"],
            "gen_tokens": h["completions/mean_length"] * spec["batch"],
        }
        for h in hist
    ]
    return {
        "train_runtime_s": out.metrics["train_runtime"],
        "train_cpu_s": cpu_s,
        "steps": trainer.state.global_step,
        "gen_tokens": sum(x["gen_tokens"] for x in per_step),
        "per_step": per_step,
        "reward": statistics.mean(h["reward"] for h in hist),
    }


# ----------------------------------------------------------------------------- runs
def _env() -> dict[str, str]:
    e = dict(os.environ)
    e.update(ENV)
    e.pop("TRACE_STORE", None)
    return e


def run_timed(cmd: list[str], threads: int) -> tuple[subprocess.CompletedProcess, float]:
    """`cmd` in the checkout with the benchmark's environment (`threads` torch threads, 0: torch's default): its
    completed process and wall time."""
    env = _env()
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    return r, time.monotonic() - t0


def run_worker(kind: str, spec: dict[str, Any], what: str) -> tuple[dict[str, Any], float]:
    """This script's `--worker KIND --spec JSON` in a subprocess: the JSON it prints last and the wall time
    (exit with its stderr when it fails)."""
    cmd = [sys.executable, __file__, "--worker", kind, "--spec", json.dumps(spec)]
    r, wall = run_timed(cmd, spec.get("threads") or 0)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), wall


def _trace_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_cli"]


def run_trace(
    args, model_dir: Path, store: Path, turns: int, tokens_per_turn: int, budget: int
) -> dict[str, Any]:
    import pyarrow.parquet as pq

    settings = {
        "require_learning": "false",  # an untrained model earns a constant reward: time the steps anyway
        "num_generations": args.num_generations,
        "per_device_batch_size": args.batch,
        "gradient_accumulation_steps": 1,
        "max_turns": turns,
        "max_new_tokens": tokens_per_turn,
        "max_completion_length": budget,
        "checkpoint_every": 0,
        "precision": "fp32",
        "gradient_checkpointing": "false",
    }
    cmd = [*_trace_cmd(), *"train --method grpo --env shop --seeds 100000:100400 --force --json".split()]
    cmd += ["--model", str(model_dir), "--store", str(store), "--max-steps", str(args.steps)]
    cmd += [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    r, wall = run_timed(cmd, args.threads)
    if r.returncode != 0:
        raise SystemExit(f"trace train failed ({r.returncode}):\n{r.stderr[-4000:]}")
    res = json.loads(r.stdout)
    rows = pq.read_table(store / "adapter" / res["id"] / "train_metrics.parquet").to_pylist()
    per_step = [
        {
            "step": x["step"],
            "step_time": x["step_time"],
            "gen_tokens": (x["completion_length"] or 0) * x["episodes"],
        }
        for x in rows
    ]
    return {
        "train_runtime_s": res["summary"]["train_s"],
        "train_cpu_s": res["summary"]["train_cpu_s"],
        "steps": res["summary"]["steps"],
        "gen_tokens": sum(x["gen_tokens"] for x in per_step),
        "per_step": per_step,
        "wall_s": wall,
        "reward": statistics.mean(x["reward"] for x in rows),
        "turns": statistics.mean(x["turns"] for x in rows if x["turns"] is not None),
    }


def run_bare(args, model_dir: Path, out_dir: Path) -> dict[str, Any]:
    spec = {
        "model": str(model_dir),
        "env": "shop",
        "seed_lo": 100000,
        "seed_hi": 100400,
        "steps": args.steps,
        "batch": args.batch,
        "num_generations": args.num_generations,
        "tokens": args.tokens,
        "out": str(out_dir),
        "threads": args.threads,
    }
    res, wall = run_worker("bare", spec, "bare TRL worker")
    res["wall_s"] = wall
    return res


def rates(r: dict[str, Any]) -> dict[str, float]:
    """Whole-run rates over TRL's train_runtime, and steady-state rates over TRL's per-step `step_time` without
    step 1 (first-call costs: lazy imports, allocator warm-up)."""
    t = r["train_runtime_s"]
    out = {"steps_per_s": r["steps"] / t, "tokens_per_s": r["gen_tokens"] / t}
    if r.get("train_cpu_s"):
        c = r["train_cpu_s"]
        out.update(cpu_steps_per_s=r["steps"] / c, cpu_tokens_per_s=r["gen_tokens"] / c)
    later = [x for x in r.get("per_step", []) if x["step"] > 1 and x["step_time"]]
    if later:
        st = sum(x["step_time"] for x in later)
        out.update(
            steady_steps_per_s=len(later) / st, steady_tokens_per_s=sum(x["gen_tokens"] for x in later) / st
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "bare":
        print(json.dumps(bare_worker(json.loads(args.spec))))
        return 0
    if args.worker == "grpo":
        print(json.dumps(grpo_worker(json.loads(args.spec))))
        return 0
    if args.model == "smollm2":
        return smollm2_main(args)
    os.environ.update(ENV)
    log = lambda m: print(f"[train_bench {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    work = Path(args.workdir or tempfile.mkdtemp(prefix="train_bench-"))
    work.mkdir(parents=True, exist_ok=True)
    import torch

    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    log(f"building the {args.preset} model in {work}")
    model_dir = (
        execute("model", {"preset": args.preset, "corpus_seeds": 40}, Store(work / "models")).main.path / "hf"
    )
    trace_runs, bare_runs = [], []
    for i in range(args.repeats):
        order = [("trace", None), ("bare", None)] if i % 2 == 0 else [("bare", None), ("trace", None)]
        for side, _ in order:
            if side == "trace":
                r = run_trace(args, model_dir, work / f"store-{i}", 1, args.tokens, args.tokens)
                trace_runs.append(r)
            else:
                r = run_bare(args, model_dir, work / f"bare-{i}")
                bare_runs.append(r)
            rr = rates(r)
            log(
                f"repeat {i + 1}/{args.repeats} {side:>5}: {r['steps']} steps in {r['train_runtime_s']:.2f} s "
                f"-> {rr['steps_per_s']:.3f} steps/s, {rr['tokens_per_s']:.0f} tokens/s"
            )
    multi = None
    if args.multi_turn_turns:
        log(f"multi-turn reference run ({args.multi_turn_turns} turns)")
        multi = run_trace(
            args,
            model_dir,
            work / "store-multi",
            args.multi_turn_turns,
            args.tokens,
            args.tokens * args.multi_turn_turns * 8,
        )

    def med(runs, key):
        vals = [rates(r).get(key) for r in runs]
        return (
            statistics.median(v for v in vals if v is not None) if any(v is not None for v in vals) else None
        )

    res = {
        "benchmark": "train_bench",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine("torch", "trl", "transformers", "peft", cuda=torch.cuda.is_available()),
        "params": {k: v for k, v in vars(args).items() if k not in ("out", "workdir", "worker", "spec")},
        "goal_ratio": GOAL,
        "trace": {"runs": trace_runs, **{k: med(trace_runs, k) for k in KEYS}},
        "bare_trl": {"runs": bare_runs, **{k: med(bare_runs, k) for k in KEYS}},
    }
    res["ratio"] = {k: res["trace"][k] / res["bare_trl"][k] for k in KEYS}
    res["meets_goal"] = {
        "wall": all(res["ratio"][k] >= GOAL for k in ("steps_per_s", "tokens_per_s")),
        "wall_steady": all(res["ratio"][k] >= GOAL for k in ("steady_steps_per_s", "steady_tokens_per_s")),
        "cpu": all(res["ratio"][k] >= GOAL for k in ("cpu_steps_per_s", "cpu_tokens_per_s")),
    }
    if multi is not None:
        res["trace_multi_turn"] = {**multi, **rates(multi)}
    out = write_result(args.out, res)
    print_report(res)
    log(f"wrote {out}")
    return 0


# (column, key, format) of the speed table and of the --model smollm2 table
SPEED_COLUMNS = (
    ("steps/s", "steps_per_s", ".3f"), ("tokens/s", "tokens_per_s", ".1f"),
    ("steady steps/s", "steady_steps_per_s", ".3f"), ("steady tokens/s", "steady_tokens_per_s", ".1f"),
    ("steps/cpu-s", "cpu_steps_per_s", ".3f"), ("tokens/cpu-s", "cpu_tokens_per_s", ".1f"),
)  # fmt: skip
EPISODE_COLUMNS = (
    ("s/episode", "s_per_episode", ".1f"), ("cpu-s/ep.", "cpu_s_per_episode", ".1f"),
    ("rollout cpu-s/ep.", "rollout_cpu_s_per_episode", ".1f"),
    ("train cpu-s/ep.", "train_cpu_s_per_episode", ".1f"),
    ("tokens/ep.", "episode_tokens", ".0f"), ("peak GiB", "max_rss_gib", ".1f"),
)  # fmt: skip


def print_head(title: str, cols, label_width: int, cell_width: int, extra: str = "") -> None:
    """The title, the column names right-aligned in cells of `cell_width` after the label column, a rule."""
    print(title)
    head = f"{'':<{label_width}}" + "".join(f"{c:>{cell_width}}" for c, _, _ in cols) + extra
    print(head)
    print("-" * len(head))


def print_report(res: dict[str, Any]) -> None:
    p, cols = res["params"], SPEED_COLUMNS
    title = (
        f"\ntrain_bench: {p['preset']} model, shop single-turn, {p['steps']} steps x {p['batch']} episodes "
        f"(groups of {p['num_generations']}), <= {p['tokens']} tokens/episode, median of {p['repeats']}"
    )
    print_head(title, cols, 28, 17, f"{'train s':>10}")

    def cells(d: dict[str, Any], fmt: str | None = None) -> str:
        return "".join(f"{'-' if d.get(k) is None else format(d[k], fmt or f):>17}" for _, k, f in cols)

    for label, key in (("trace train --method grpo", "trace"), ("bare TRL GRPOTrainer", "bare_trl")):
        d = res[key]
        t = statistics.median(r["train_runtime_s"] for r in d["runs"])
        print(f"{label:<28}{cells(d)}{t:>10.2f}")
    print(f"{'ratio trace / bare':<28}{cells(res['ratio'], '.3f')}")
    m = res.get("trace_multi_turn")
    if m:
        print(
            f"{'trace, multi-turn (ref.)':<28}{cells(m)}{m['train_runtime_s']:>10.2f}  ({m['turns']:.1f} turns/ep.)"
        )
    w = statistics.median(r["wall_s"] for r in res["trace"]["runs"])
    goal = ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in res["meets_goal"].items())
    print(f"goal ratio >= {res['goal_ratio']}: {goal}")
    print(f"trace train end-to-end wall (median): {w:.1f} s (imports, model load, artifact commit included)")


# ----------------------------------------------------------------------------- --model smollm2
def grpo_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One `train_grpo` step with the trainer of `spec["src"]` (a source tree put first on sys.path), timing the
    rollouts (the shared rollout loop, wrapped) apart from the rest of the step."""
    import resource

    sys.path.insert(0, spec["src"])
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    import trace_cli
    import trace_cli.envs.rollout as rollout_mod
    from trace_cli.envs.registry import make_env
    from trace_cli.stages.train import method_config
    from trace_cli.training.grpo import GRPOSpec, train_grpo

    timing = {"rollout_s": 0.0, "rollout_cpu_s": 0.0, "episodes": 0, "gen_tokens": 0, "episode_tokens": []}
    inner = rollout_mod.rollout

    def timed(*a, **kw):
        t0, c0 = time.monotonic(), time.process_time()
        res = inner(*a, **kw)
        timing["rollout_s"] += time.monotonic() - t0
        timing["rollout_cpu_s"] += time.process_time() - c0
        timing["episodes"] += len(res)
        timing["gen_tokens"] += sum(r.gen_tokens for r in res)
        for r in res:
            last = r.turns[-1] if r.turns else None
            timing["episode_tokens"].append(
                len(last["prompt_ids"]) + len(last["completion_ids"]) if last else 0
            )
        return res

    rollout_mod.rollout = timed  # grpo.py imports it when its rollout_func is built
    cfg = method_config({"method": "grpo", "env": "shop", "model": spec["model"], **spec["settings"]})
    # a tree from before GRPOSpec carried episodes_per_step computes it itself
    per_step = {"episodes_per_step": cfg["per_device_batch_size"] * cfg["gradient_accumulation_steps"]}
    g = GRPOSpec.from_config(
        cfg,
        model_path=spec["model"],
        make_env=lambda: make_env("shop"),
        seeds=list(range(spec["seed_lo"], spec["seed_lo"] + 1000)),
        output_dir=spec["out"],
        **(per_step if "episodes_per_step" in GRPOSpec.__dataclass_fields__ else {}),
    )
    res = train_grpo(g)
    hist = [h for h in res.log_history if "reward" in h]
    return {
        "src": str(Path(trace_cli.__file__).parent),
        "train_s": res.train_runtime_s,
        "train_cpu_s": res.train_cpu_s,
        **timing,
        "steps": res.global_step,
        "reward": statistics.mean(h["reward"] for h in hist) if hist else None,
        "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def export_tree(ref: str, dest: Path) -> Path:
    """The package and schemas of `ref` (git archive), for the before side."""
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "trace_cli", "schemas"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest


def smollm2_side(args, label: str, src: Path, model_dir: Path, work: Path, settings: dict[str, Any]) -> dict:
    spec = {
        "src": str(src),
        "model": str(model_dir),
        "seed_lo": 100000,
        "settings": settings,
        "out": str(work / f"ckpt-{label}"),
        "threads": args.threads,
    }
    res, wall = run_worker("grpo", spec, f"{label} worker")
    res.update(label=label, wall_s=wall, settings=settings)
    return res


def per_episode(r: dict[str, Any]) -> dict[str, float]:
    """Seconds per episode (wall and process CPU): the whole step, its rollouts, and the rest (log-probabilities,
    backward, optimizer)."""
    n = max(r["episodes"], 1)
    return {
        "s_per_episode": r["train_s"] / n,
        "cpu_s_per_episode": r["train_cpu_s"] / n,
        "rollout_s_per_episode": r["rollout_s"] / n,
        "rollout_cpu_s_per_episode": r["rollout_cpu_s"] / n,
        "train_s_per_episode": (r["train_s"] - r["rollout_s"]) / n,
        "train_cpu_s_per_episode": (r["train_cpu_s"] - r["rollout_cpu_s"]) / n,
        "episode_tokens": statistics.mean(r["episode_tokens"]) if r["episode_tokens"] else 0.0,
    }


def smollm2_settings(args, *, micro: int, checkpointing: bool) -> dict[str, Any]:
    return {
        "num_generations": args.num_generations,
        "per_device_batch_size": micro,
        "gradient_accumulation_steps": args.episodes // micro,
        "max_steps": 1,
        "max_turns": 12,
        "max_new_tokens": args.tokens,
        "max_completion_length": 1024,
        "rollout_batch_size": 64,
        "checkpoint_every": 0,
        "precision": "fp32",
        "gradient_checkpointing": checkpointing,
        "drop_constant_groups": False,  # every episode is trained on, whatever its reward (same work both sides)
        "seed": 0,
    }


def smollm2_main(args) -> int:
    os.environ.update(ENV)
    log = lambda m: print(f"[train_bench {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    work = Path(args.workdir or tempfile.mkdtemp(prefix="train_bench-smollm2-"))
    work.mkdir(parents=True, exist_ok=True)
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    log(f"importing smollm2-135m-instruct into {work / 'models'}")
    model_dir = execute("model", {"source": "smollm2-135m-instruct"}, Store(work / "models")).main.path / "hf"
    sides = []
    if args.before_ref != "none":
        src = export_tree(args.before_ref, work / "before-src")
        micro = min(2, args.episodes)
        sides.append(("before", src, smollm2_settings(args, micro=micro, checkpointing=True)))
    after = smollm2_settings(args, micro=args.num_generations, checkpointing=False)
    sides.append(("after", REPO, after))
    runs: list[dict[str, Any]] = []
    out_path = (
        args.out if args.out != str(RESULTS / "train_bench.json") else RESULTS / "train_bench_smollm2.json"
    )
    res = {
        "benchmark": "train_bench_smollm2",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python", *sys.argv]),
        "commit": _commit(),
        "before_ref": args.before_ref,
        "machine": machine("torch", "trl", "transformers", "peft"),
        "params": {
            "episodes": args.episodes,
            "num_generations": args.num_generations,
            "tokens": args.tokens,
            "threads": args.threads,
        },
        "goal_s_per_episode": SMOL_GOAL_S,
        "runs": runs,
    }
    for label, src, settings in sides:
        log(f"{label}: one GRPO step of {args.episodes} shop episodes ({src})")
        r = smollm2_side(args, label, src, model_dir, work, settings)
        r.update(per_episode(r))
        runs.append(r)
        log(f"{label}: {r['s_per_episode']:.1f} s/episode ({r['cpu_s_per_episode']:.1f} cpu-s)")
        write_result(
            out_path, {**res, "partial": len(runs) < len(sides)}
        )  # a side is kept if a later one dies
    by = {r["label"]: r for r in runs}
    if "before" in by:
        res["speedup"] = {
            k: by["before"][k] / by["after"][k]
            for k in (
                "s_per_episode",
                "cpu_s_per_episode",
                "rollout_cpu_s_per_episode",
                "train_cpu_s_per_episode",
            )
            if by["after"][k] > 0
        }
    res["meets_goal"] = by["after"]["s_per_episode"] <= SMOL_GOAL_S
    out = write_result(out_path, {**res, "partial": False})
    print_smollm2(res)
    log(f"wrote {out}")
    return 0


def _commit() -> str | None:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def print_smollm2(res: dict[str, Any]) -> None:
    p, cols = res["params"], EPISODE_COLUMNS
    title = (
        f"\ntrain_bench --model smollm2: one GRPO step, {p['episodes']} shop episodes (groups of "
        f"{p['num_generations']}, <= {p['tokens']} tokens a turn, <= 1024 a conversation), {p['threads']} thread(s)"
    )
    print_head(title, cols, 34, 19)
    for r in res["runs"]:
        s = r["settings"]
        gc = "on" if s["gradient_checkpointing"] else "off"
        label = f"{r['label']} (micro {s['per_device_batch_size']}, gc {gc}, {s['precision']})"
        print(f"{label:<34}" + "".join(f"{format(r[k], f):>19}" for _, k, f in cols))
    if "speedup" in res:
        sp = res["speedup"]
        print(
            f"{'speed-up before / after':<34}"
            + "".join(f"{format(sp[k], '.2f') + 'x' if k in sp else '':>19}" for _, k, _ in cols)
        )
    after = next(r for r in res["runs"] if r["label"] == "after")
    print(
        f"goal <= {res['goal_s_per_episode']:.0f} s/episode: {'met' if res['meets_goal'] else 'NOT met'} "
        f"(after: {after['s_per_episode']:.1f} s wall, {after['cpu_s_per_episode']:.1f} cpu-s per episode)"
    )


if __name__ == "__main__":
    sys.exit(main())
