"""The trained methods at every budget: GRPO on the target, and TRACE (diagnose, synthesize and calibrate on the
base agent, one GRPO adapter per environment, composed). Each returns, per budget, the row fields of one
training seed: pass@1 and the per-task outcomes of every method (`tasks_<method>`, for the paired analysis)."""

from __future__ import annotations

import sys
from typing import Any

from se.measure import Bench
from se.plan import plan_steps, spent
from se.settings import Settings
from se.stats import ABLATIONS, COMPOSE_METHODS, one_expert_ablation
from trace_cli.config.seeds import parse_seeds

ACCOUNTINGS = {"all": "", "training": "_train"}  # accounting -> column suffix


def grpo_cfg(
    s: Settings, method: str, env: str, model: str, steps: int, seed: int, max_turns: int
) -> dict[str, Any]:
    return {
        "method": "grpo",
        "env": env,
        "model": model,
        "seed": seed,
        "max_steps": steps,
        "num_generations": s.num_generations,
        "per_device_batch_size": s.episodes_per_step,
        "gradient_accumulation_steps": 1,
        "learning_rate": s.lr(method),
        "lr_scheduler": "constant",  # snapshots are the shorter runs
        "max_new_tokens": s.max_new_tokens,
        "max_completion_length": 1024,
        "max_turns": max_turns,
        "checkpoint_every": 5,  # a stopped benchmark resumes its GRPO run (not part of the id)
        "require_learning": False,  # a budget too small to learn is a result, not an error
    }


def train_curve(b: Bench, label: str, cfg: dict[str, Any], steps: list[int]) -> dict[int, Any]:
    """One GRPO run to max(steps) storing the adapter after every other entry: {steps: adapter artifact}."""
    top = max(steps)
    snaps = sorted({k for k in steps if k < top})
    art = b.run(label, "train", {**cfg, "max_steps": top, "snapshot_steps": snaps}).outputs["adapter"]
    out = {top: art}
    for k, uri in (art.summary.get("snapshots") or {}).items():
        out[int(k)] = b.store.resolve(uri, kind="adapter")
    return out


def run_grpo_target(b: Bench, s: Settings, target: str, base: str, seed: int) -> dict[int, dict[str, Any]]:
    """GRPO on the target: one run per training seed, the adapter after budget // episodes_per_step steps (the
    same under both accountings: every rollout is a training rollout)."""
    tgt = s.target(target)
    steps = {B: max(1, B // s.episodes_per_step) for B in s.budgets}
    cfg = grpo_cfg(s, "grpo_target", tgt.train_env, base, max(steps.values()), seed, tgt.max_turns)
    cfg["seeds"] = tgt.train_seeds
    arts = train_curve(b, f"{target}/grpo_target/{seed}", cfg, list(steps.values()))
    out = {}
    for B, k in steps.items():
        ev = b.eval(
            f"{target}/grpo_target/eval/{B}/{seed}",
            arts[k].uri,
            tgt.test_env,
            s.held_out_of(target),
            max_turns=tgt.max_turns,
        )
        out[B] = {
            "grpo_target": ev["pass@1"],
            "grpo_rollouts": k * s.episodes_per_step,
            "grpo_constant_groups": arts[k].summary.get("frac_constant_groups"),
            "families_grpo_target": ev["families"],
            "tasks_grpo_target": ev["tasks"],
        }
    return out


def run_trace(
    b: Bench, s: Settings, target: str, base: str, seed: int, base_ev: dict[str, Any]
) -> dict[int, dict[str, Any]]:
    """TRACE at every budget and both accountings from one diagnosis, one calibration and one GRPO run per
    environment."""
    return Trace(b, s, target, base, seed, base_ev).run()


def charge_moe(sp: dict[str, int], moe_eval: dict[str, Any]) -> None:
    """Add the episodes the MoE's composition generated for its gates (none when the adapters kept their own
    training episodes and a diagnosis labels the target's) to a configuration's spend."""
    gen = int((moe_eval.get("routing") or {}).get("generated_episodes") or 0)
    sp["moe"] = sp.get("moe", 0) + gen
    sp["total"] += gen


class Trace:
    """One training seed of TRACE on one target; `fixed` is what it spent before GRPO (every rollout counted)."""

    def __init__(self, b: Bench, s: Settings, target: str, base: str, seed: int, base_ev: dict[str, Any]):
        self.b, self.s, self.target, self.base, self.seed, self.base_ev = b, s, target, base, seed, base_ev
        self.tgt = s.target(target)
        self.mt = self.tgt.max_turns
        self.fixed = {"diagnosis": s.diagnosis_rollouts, "calibration": 0, "moe": 0}
        self.composed: dict[tuple, dict[str, dict[str, Any]]] = {}
        self.order: list[str] = []

    def eval(
        self, label: str, model: str, seeds: str | None = None, env: str | None = None
    ) -> dict[str, Any]:
        path = f"{self.target}/trace/{label}/{self.seed}"
        seeds = seeds or self.s.held_out_of(self.target)
        return self.b.eval(path, model, env or self.tgt.test_env, seeds, max_turns=self.mt)

    def diagnose(self):
        s, target = self.s, self.target
        cfg = {
            "model": self.base,
            "env": self.tgt.train_env,
            "seeds": self.tgt.diagnosis_seeds(s.diagnosis_rollouts),
            "max_new_tokens": s.max_new_tokens,
            "max_turns": self.mt,
        }
        ro = self.b.run(f"{target}/trace/diagnosis-rollouts", "eval", cfg).outputs["rollouts"]
        cfg = {"rollouts": ro.uri, "analyst": "rules", "seed": self.seed}
        return self.b.run(f"{target}/trace/diagnose", "diagnose", cfg).outputs["diagnosis"]

    def synthesize(self, d_art, cap: str):
        """The calibrated environment of one capability, or None (charged the calibration rollouts it ran)."""
        from trace_cli.errors import CheckFailed, TraceError

        s = self.s
        calibration = {
            "seeds": s.cal_seeds,
            "rollouts": s.cal_rollouts,
            "look": s.calibration_look,
            "max_attempts": s.calibration_attempts,
            "max_new_tokens": s.max_new_tokens,
            "max_completion_length": 1024,
            "tokens": True,
        }
        cfg = {
            "diagnosis": d_art.uri,
            "capability": cap,
            "target": self.tgt.synthesize,
            "tools": s.env_tools,
            "model": self.base,
            "seed": self.seed,
            **({"params": {"level": 0}} if s.calibration_start == "easiest" else {}),
            "calibration": calibration,
        }
        try:
            out = self.b.run(f"{self.target}/trace/synthesize/{cap}/{self.seed}", "synthesize", cfg)
        except CheckFailed as e:  # out of band at every level tried: skipped, charged what it ran
            ran = int((e.details or {}).get("rollouts_run") or 0)
            print(f"  {cap}: no environment ({ran} calibration rollouts): {e}", file=sys.stderr)
            self.fixed["calibration"] += ran
            return None, ran
        except TraceError as e:
            print(f"  {cap}: no environment ({e})", file=sys.stderr)
            return None, 0
        env_art = out.outputs["environment"]
        self.fixed["calibration"] += self.b.calibration_rollouts(env_art)
        return env_art, None

    def run(self) -> dict[int, dict[str, Any]]:
        s, per_step = self.s, self.s.episodes_per_step
        self.d_art = self.diagnose()
        selected = list(self.d_art.summary.get("selected", []))
        envs: dict[str, Any] = {}
        failed: dict[str, int] = {}
        for cap in selected:
            env_art, ran = self.synthesize(self.d_art, cap)
            if env_art is None:
                failed[cap] = ran
            else:
                envs[cap] = env_art
        common = {
            "selected": selected,
            "environments": sorted(envs),
            "calibration_failed": failed,
            "calibrated_by": {c: "base" for c in envs},
        }
        fixed = self.fixed
        if not envs:
            return {B: {**common, "spent": {**fixed, "total": sum(fixed.values())}} for B in s.budgets}
        self.order = order = [c for c in selected if c in envs]  # diagnosis rank: the gates' slot order
        # the gates learn from the adapters' own training episodes and the diagnosed conversations (paid for);
        # any episodes compose must generate beyond those are charged when it has run (`charge_moe`)
        fixed["moe"] = 0
        reuse = {
            c: ((envs[c].summary.get("calibration_rollouts") or {}).get("episodes", 0) // per_step)
            for c in order
        }
        val = s.adapter_validation_block()
        val_plan = (val["every"], len(parse_seeds(val["seeds"]))) if val else (1, 0)
        plan = plan_steps(list(s.budgets), sum(fixed.values()), reuse, per_step, val_plan)
        curves: dict[str, dict[int, Any]] = {}
        for cap in order:
            wanted = sorted({plan[acc][B][cap] for acc in plan for B in s.budgets})
            cfg = {
                **grpo_cfg(s, "trace", envs[cap].uri, self.base, 1, self.seed, 12),
                "reuse_calibration": reuse[cap],
                "validation": val,
            }
            curves[cap] = train_curve(self.b, f"{self.target}/trace/train/{cap}/{self.seed}", cfg, wanted)
        results: dict[int, dict[str, Any]] = {}
        for B in s.budgets:
            r: dict[str, Any] = {**common}
            for acc, sfx in ACCOUNTINGS.items():
                steps = plan[acc][B]
                adapters = {c: curves[c][steps[c]] for c in order}
                trained = {c: int(adapters[c].summary.get("steps") or steps[c]) for c in order}
                chosen = {c: (adapters[c].summary.get("validation") or {}).get("episodes", 0) for c in order}
                sp = spent(fixed, trained, reuse, per_step, chosen if acc == "all" else None)
                r[f"validation{sfx}"] = {
                    c: {
                        k: (adapters[c].summary.get("validation") or {}).get(k)
                        for k in ("best_step", "stopped_at", "episodes")
                    }
                    for c in order
                }
                r[f"spent{sfx}"] = sp
                r[f"adapter_steps{sfx}"] = steps
                r[f"constant_groups{sfx}"] = {
                    c: adapters[c].summary.get("frac_constant_groups") for c in order
                }
                last = B == max(s.budgets) and acc == "all"
                comps = self.compositions(adapters, last, f"{acc}-{B}")
                if acc == "all":
                    charge_moe(sp, comps["moe"])
                    if sp["total"] > B:
                        r["over_budget"] = (
                            f"spent {sp['total']} rollouts of {B} (the fixed cost alone is {sum(fixed.values())})"
                        )
                for m, e in comps.items():
                    r[f"{m}{sfx}"] = e["pass@1"]
                    r[f"families_{m}{sfx}"] = e["families"]
                    r[f"tasks_{m}{sfx}"] = e["tasks"]
                    if e.get("routing"):
                        r[f"routing{sfx}"] = e["routing"]
                r[f"trace{sfx}"] = r[f"moe{sfx}"]  # TRACE is the MoE (decided in advance: no best-of)
                r[f"tasks_trace{sfx}"] = r[f"tasks_moe{sfx}"]
                if last and s.purpose == "test":  # (a sweep's seeds are the validation seeds themselves)
                    r.update(self.single_best(adapters, comps, B, sp))
            results[B] = r
        return results

    def compositions(self, adapters: dict[str, Any], last: bool, tag: str) -> dict[str, dict[str, Any]]:
        """Router and MoE (and merge, at the largest budget) of these adapters on the test seeds. The base is
        always a slot of router and MoE, so one adapter is composed too (a task or token that does not need it goes
        to the base); merging one adapter is that adapter."""
        methods = COMPOSE_METHODS if last else tuple(m for m in COMPOSE_METHODS if m not in ABLATIONS)
        have = self.composed.setdefault(tuple(adapters[c].id for c in self.order), {})
        for method in methods:
            if method in have:
                continue
            if method == "merge" and len(self.order) == 1:
                have[method] = self.eval(f"eval/{self.order[0]}/{tag}", adapters[self.order[0]].uri)
            else:
                have[method] = self.compose(method, [adapters[c].uri for c in self.order], tag)
        return {m: have[m] for m in methods}

    def compose(self, method: str, uris: list[str], tag: str) -> dict[str, Any]:
        """One composition of these adapters, evaluated on the test seeds (the MoE: with its routing)."""
        s, seed = self.s, self.seed
        extra = {}
        if method == "moe":
            extra["moe"] = {
                "target": self.tgt.train_env,
                "seeds": self.tgt.moe_seeds(s.moe_seeds),
                "diagnosis": self.d_art.uri,
                "test_rollouts": self.base_ev["rollouts"],
                "steps": s.moe_steps,
                "max_turns": 12,
            }
        cfg = {"method": method, "base": self.base, "adapters": uris, "seed": seed, **extra}
        comp = self.b.run(f"{self.target}/trace/compose/{method}/{tag}/{seed}", "compose", cfg)
        comp = comp.outputs["composition"]
        ev = self.eval(f"eval/{method}/{tag}", comp.uri)
        if method == "moe":
            keys = (
                "routing_accuracy",
                "routing_accuracy_per_expert",
                "routing_test_episodes",
                "transcripts",
                "generated_episodes",
            )
            ev["routing"] = {k: comp.summary.get(k) for k in keys}
        return ev

    def single_best(self, adapters, comps, B: int, sp: dict[str, int]) -> dict[str, Any]:
        """The ablation: each adapter alone on the test seeds, the best chosen on the validation seeds, whose
        rollouts are charged to it (`spent_single_best`; over the budget, it is marked)."""
        s = self.s
        tgt = self.tgt  # choices on validation seeds (τ²: its training tasks), never on test seeds
        val = {
            c: self.eval(f"val/{c}/{B}", adapters[c].uri, tgt.validation or s.validation, tgt.train_env)
            for c in self.order
        }
        experts = {c: self.eval(f"eval/{c}/{B}", adapters[c].uri) for c in self.order}
        best = max(self.order, key=lambda c: val[c]["pass@1"])
        charged = sum(v["episodes"] for v in val.values())
        r: dict[str, Any] = {
            "experts": {c: e["pass@1"] for c, e in experts.items()},
            "experts_validation": {c: v["pass@1"] for c, v in val.items()},
            "single_best": {
                "capability": best,
                "pass@1": experts[best]["pass@1"],
                "chosen_on": tgt.validation or s.validation,
            },
            "tasks_single_best": experts[best]["tasks"],
            "spent_single_best": {**sp, "validation": charged, "total": sp["total"] + charged},
        }
        if sp["total"] + charged > B:
            r["single_best_over_budget"] = (
                f"spent {sp['total'] + charged} rollouts of {B} ({charged} validation)"
            )
        if len(experts) > 1:
            r["ablation"] = one_expert_ablation(self.base_ev["solved"], experts, comps)
        return r
