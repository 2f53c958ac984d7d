"""`shop-mixed`: its task structure is counted against the vendored τ²-bench tasks; every task is solvable by its
reference, all-or-nothing, and each capability's deficit demonstration fails exactly where it is needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trace_cli.envs.registry import make_env
from trace_cli.envs.scripted import replay
from trace_cli.envs.shop.tasks import mixed
from trace_cli.envs.shop.tasks.mixed import WRITES, build_task, needs_figures
from trace_cli.envs.shop.tools import TOOL_SCHEMAS
from trace_cli.errors import UsageError

TAU2 = Path(__file__).resolve().parents[2] / "examples" / "tau2"
TABLE = re.compile(r"^  (\S.*?)\s{2,}(0\.\d\d)\s+(0\.\d\d)$", re.M)


def tau2_references() -> list[list[dict]]:
    return [
        (task.get("evaluation_criteria") or {}).get("actions") or []
        for domain in ("retail", "airline")
        for task in json.loads((TAU2 / f"{domain}_tasks.json").read_text())
    ]


def test_task_mix_mirrors_tau2_bench_and_the_docstring_says_so():
    tau = needs_figures(tau2_references())
    tasks = [build_task(seed, 5) for seed in range(2000)]
    ours = needs_figures([t.reference for t in tasks], [bool(getattr(t, "later", ())) for t in tasks])
    assert tau["tasks"] == 164
    keys = [k for k in tau if k != "tasks"]
    for k in keys:
        assert abs(ours[k] - tau[k]) <= 0.05, (k, ours[k], tau[k])
    # the table in tasks/mixed.py's docstring is these two columns, row by row
    rows = TABLE.findall(mixed.__doc__)
    assert [(float(t), float(o)) for _, t, o in rows] == [(round(tau[k], 2), round(ours[k], 2)) for k in keys]
    # several requests are revealed in turn, and only several
    assert all(bool(getattr(t, "later", ())) == t.family.startswith("mixed") for t in tasks)


def test_every_task_offers_every_tool_and_the_user_reveals_requests_in_turn():
    env = make_env("shop-mixed")
    seed = next(s for s in range(100) if build_task(s, 5).family == "mixed3")
    obs = env.reset(seed)
    assert {t["function"]["name"] for t in obs.tools} == set(TOOL_SCHEMAS)
    task = env._task
    assert task.later and task.later[0] not in obs.messages[0]["content"]
    ref = env.reference_actions()
    first_report = next(i for i, a in enumerate(ref) if "content" in a)
    episode = replay(env, seed, ref[: first_report + 1])
    assert episode.results[-1].observation.endswith(task.later[0]) and not episode.results[-1].done
    # stopping after the first request: the user has revealed the second, the task is not done
    assert not episode.verdict.success


def test_reference_succeeds_and_deficits_fail_where_needed():
    env = make_env("shop-mixed")
    seen_needed = 0
    for seed in range(2000):
        env.reset(seed)
        task = env._task
        episode = replay(env, seed, env.reference_actions())
        assert episode.verdict.success, (seed, task.family, episode.verdict.details)
        assert not any(r.error for r in episode.results), seed
        assert len(episode.actions) <= env.max_turns
        for cap, demo in task.deficit_demos.items():
            assert cap in task.capabilities
            if (
                cap == "precondition_verification"
                and "cancel_refused" not in task.variant
                and (task.family != "cancel_order" or task.variant == "allowed")
            ):
                continue  # cancelling a pending order without reading it first happens to be right
            seen_needed += 1
            assert not replay(env, seed, demo).verdict.success, (seed, cap, task.variant)
    assert seen_needed > 200


def test_several_requests_are_all_or_nothing():
    env = make_env("shop-mixed")
    seed = next(s for s in range(100) if build_task(s, 5).family == "mixed3")
    env.reset(seed)
    ref = env.reference_actions()
    # drop the last operation's write: the other requests are done, the task is not
    last_write = max(i for i, a in enumerate(ref) if a.get("name") in WRITES)
    partial = ref[:last_write] + ref[last_write + 1 :]
    verdict = replay(env, seed, partial).verdict
    assert not verdict.success and verdict.components["db_records"] > 0.5


def test_registered_with_its_own_task_ids_and_parameters():
    env = make_env("shop-mixed?max_turns=20")
    assert env.max_turns == 20 and env.name == "shop-mixed"
    obs = env.reset(3)
    assert obs.task_id.startswith("shop-mixed-") and obs.info["env"] == "shop-mixed"
    assert make_env("shop-mixed").reset(3).messages == obs.messages  # same seed, same task
    with pytest.raises(UsageError, match="families"):
        make_env("shop-mixed?families=cancel_order")


@pytest.mark.slow
def test_the_demo_base_agent_scores_in_the_target_band(tmp_path):
    """The committed base agent (examples/demo-base-agent) scores pass@1 in [0.15, 0.45] on shop-mixed with each
    task's own tools (measured 0.29): single requests as on the shop, several requests almost never (it stops
    after the first write). It was trained with each family's own tool list and takes that list as a cue to the
    task: with every tool offered (shop-mixed's default, as in τ²-bench) it scores 0.02 on seeds 0:100."""
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    st = Store(tmp_path / "store")
    repo = Path(__file__).resolve().parents[2]
    base = execute("model", {"source": str(repo / "examples" / "demo-base-agent")}, st).main
    cfg = {
        "model": base.uri,
        "env": "shop-mixed?tool_set=task",
        "seeds": "500000:500100",
        "max_new_tokens": 120,
        "max_turns": 16,
    }
    ev = execute("eval", cfg, st).outputs["eval"].summary
    assert 0.15 <= ev["pass@1"] <= 0.45, ev["pass@1"]
    fams = ev["families"]
    several = [f for f in fams if f.startswith("mixed")]
    assert several and all(fams[f]["pass@1"] <= 0.1 for f in several), fams
