"""The checks that gate a synthesized environment (templates and sandboxed modules alike).

determinism  same seed => same opening observation, and the same observations, rewards and verdict for the
             same actions (reference, perturbed, do-nothing), across instances and across resets
reference    the environment's reference solution reaches reward 1 (success) on every seed checked
do_nothing   an agent that only says "Goodbye." never succeeds
leakage      the values the agent must find (`task_metadata()["answer_values"]`) never appear in the
             opening messages (nor, for ids and amounts, in the system prompt)
tools        every tool the environment offers equals the target's (name + parameters), or is a shop tool the
             target lacks, where that is allowed (`check_tools`)

`admit` runs them all and refuses the environment (CheckFailed, exit 1) at the first that fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_cli.envs.base import Environment
from trace_cli.envs.scripted import ActionFuzzer, replay
from trace_cli.envs.synthetic.base import leaked_values

EnvFactory = Callable[[], Environment]
GOODBYE = {"content": "Goodbye."}


@dataclass
class CheckResult:
    name: str
    passed: bool
    seeds: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fingerprint(env: Environment, seed: int, actions: list[dict[str, Any]]) -> str:
    ep = replay(env, seed, actions)
    v = ep.verdict
    return json.dumps(
        {
            "results": [(r.observation, r.role, r.done, round(r.reward, 9), r.error) for r in ep.results],
            "verdict": [
                round(v.reward, 9),
                v.success,
                {k: round(x, 9) for k, x in sorted(v.components.items())},
            ],
        },
        sort_keys=True,
        default=str,
    )


def check_determinism(factory: EnvFactory, seeds: Iterable[int]) -> CheckResult:
    seeds = list(seeds)
    bad: list[str] = []
    a, b = factory(), factory()
    for seed in seeds:
        oa, ob = a.reset(seed).to_dict(), b.reset(seed).to_dict()
        if oa != ob:
            bad.append(f"seed {seed}: two instances open with different observations")
            continue
        if a.task_metadata() != b.task_metadata():
            bad.append(f"seed {seed}: task metadata differs between instances")
            continue
        ref = a.reference_actions()
        noise = ActionFuzzer(seed)
        perturbed = [noise.action(a.reset(seed)) for _ in range(4)] + ref
        for label, acts in (("reference", ref), ("perturbed", perturbed), ("do-nothing", [GOODBYE] * 3)):
            fa, fb, fa2 = (
                _fingerprint(a, seed, acts),
                _fingerprint(b, seed, acts),
                _fingerprint(a, seed, acts),
            )
            if not fa == fb == fa2:
                bad.append(f"seed {seed}: the {label} actions give different results on replay")
                break
        if len(bad) >= 5:
            break
    msg = f"{len(seeds)} seeds: same seed, same episode" if not bad else "; ".join(bad[:3])
    return CheckResult("determinism", not bad, len(seeds), msg, {"failures": bad})


def check_reference(factory: EnvFactory, seeds: Iterable[int]) -> CheckResult:
    seeds = list(seeds)
    env = factory()
    fails: list[dict[str, Any]] = []
    rewards = []
    for seed in seeds:
        env.reset(seed)
        v = replay(env, seed, env.reference_actions()).verdict
        rewards.append(v.reward)
        if not (v.success and abs(v.reward - 1.0) < 1e-9):
            fails.append({"seed": seed, "reward": v.reward, "components": v.components})
    msg = (
        f"reward 1 on all {len(seeds)} seeds"
        if not fails
        else f"reference solution fails on {len(fails)}/{len(seeds)} seeds (first: seed {fails[0]['seed']}, "
        f"reward {fails[0]['reward']:.3f}, {fails[0]['components']})"
    )
    return CheckResult(
        "reference",
        not fails and bool(seeds),
        len(seeds),
        msg,
        {"min_reward": min(rewards) if rewards else None, "failures": fails[:10]},
    )


def check_do_nothing(factory: EnvFactory, seeds: Iterable[int]) -> CheckResult:
    seeds = list(seeds)
    env = factory()
    wins, rewards = [], []
    for seed in seeds:
        env.reset(seed)
        for _ in range(max(1, int(getattr(env, "max_turns", 12)))):
            if env.step(dict(GOODBYE)).done:
                break
        v = env.verify()
        rewards.append(v.reward)
        if v.success:
            wins.append(seed)
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    msg = (
        f"success 0/{len(seeds)}, mean reward {mean:.3f}"
        if not wins
        else f"saying 'Goodbye.' succeeds on {len(wins)}/{len(seeds)} seeds (e.g. seed {wins[0]})"
    )
    return CheckResult("do_nothing", not wins, len(seeds), msg, {"successes": len(wins), "mean_reward": mean})


def check_leakage(factory: EnvFactory, seeds: Iterable[int]) -> CheckResult:
    seeds = list(seeds)
    env = factory()
    leaks: list[str] = []
    undeclared = []
    for seed in seeds:
        obs = env.reset(seed)
        answers = [a for a in (env.task_metadata().get("answer_values") or []) if str(a).strip()]
        if not answers:
            undeclared.append(seed)
            continue
        texts = [m["content"] for m in obs.messages if isinstance(m.get("content"), str)]
        found = leaked_values(answers, texts)
        specific = [a for a in answers if any(ch.isdigit() for ch in str(a))]
        found += [a for a in leaked_values(specific, [obs.system_prompt]) if a not in found]
        if found:
            leaks.append(f"seed {seed}: {', '.join(found[:3])}")
    ok = not leaks and not undeclared
    if undeclared:
        msg = f"no answer_values in task_metadata on {len(undeclared)}/{len(seeds)} seeds (cannot check leakage)"
    elif leaks:
        msg = f"answers appear in the opening messages on {len(leaks)}/{len(seeds)} seeds ({leaks[0]})"
    else:
        msg = f"no answer in the opening messages on {len(seeds)} seeds"
    return CheckResult("leakage", ok, len(seeds), msg, {"leaks": leaks[:10], "undeclared": undeclared[:10]})


def run_checks(
    factory: EnvFactory,
    *,
    reference_seeds: int,
    determinism_seeds: int,
    do_nothing_seeds: int,
    leakage_seeds: int,
    start: int = 0,
) -> list[CheckResult]:
    """Every check, on seeds start, start+1, ...; stops early only when the environment itself raises."""
    return [
        check_determinism(factory, range(start, start + determinism_seeds)),
        check_reference(factory, range(start, start + reference_seeds)),
        check_do_nothing(factory, range(start, start + do_nothing_seeds)),
        check_leakage(factory, range(start, start + leakage_seeds)),
    ]


def check_tools(env: Environment, target_tools: dict[str, Any], *, fallback_ok: bool) -> dict[str, Any]:
    """Every tool the environment exposes equals the target's (name + parameters), or is an allowed fallback (the
    environment's world's own schema, where that world falls back: the shop; a module's environment: the shop's)."""
    from trace_cli.envs.worlds import DEFAULT, get_world

    world = getattr(env, "world", None) or get_world(DEFAULT)
    TOOL_SCHEMAS = world.schemas if world.fallback else {}  # noqa: N806
    obs = env.reset(0)
    bad, missing = [], []
    for t in obs.tools:
        fn = t.get("function", {})
        name = fn.get("name")
        if name in target_tools:
            want = target_tools[name]["function"]
            if (fn.get("name"), fn.get("parameters")) != (want["name"], want.get("parameters")):
                bad.append(f"{name}: the argument schema differs from the target's")
        elif (
            fallback_ok
            and name in TOOL_SCHEMAS
            and fn.get("parameters") == TOOL_SCHEMAS[name]["function"]["parameters"]
        ):
            missing.append(name)
        else:
            bad.append(f"{name}: not a tool of the target")
    msg = (
        (
            f"{len(obs.tools)} tools equal the target's"
            + (f" ({len(missing)} {world.name} fallbacks: {', '.join(missing)})" if missing else "")
        )
        if not bad
        else "; ".join(bad)
    )
    return {
        "name": "tools",
        "passed": not bad,
        "seeds": 1,
        "message": msg,
        "details": {
            "tools": [t["function"]["name"] for t in obs.tools],
            "fallbacks": missing,
            "problems": bad,
        },
    }


def admit(
    factory: EnvFactory,
    capability: str,
    target_tools: dict[str, Any],
    *,
    fallback_ok: bool,
    seeds: dict[str, int],
    start: int,
) -> list[dict[str, Any]]:
    """Every check (`seeds`: the synthesize config's `checks` counts) plus the tools check, as dicts; the
    first failure raises CheckFailed with all the results."""
    from trace_cli.errors import CheckFailed

    results = [r.to_dict() for r in run_checks(factory, **seeds, start=start)]
    results.append(check_tools(factory(), target_tools, fallback_ok=fallback_ok))
    failed = [r for r in results if not r["passed"]]
    if failed:
        err = CheckFailed(f"{capability}: check {failed[0]['name']} failed: {failed[0]['message']}")
        err.details = {"capability": capability, "checks": results}
        raise err
    return results
