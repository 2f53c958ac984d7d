"""Calibration mechanics: group statistics, the band, and difficulty adjustment with scripted policies."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from trace_cli.envs.synthetic import get_template
from trace_cli.envs.synthetic.calibrate import Band, calibrate, group_stats, judge
from trace_cli.envs.synthetic.hints import OPEN, HintedEnv, guidance, hinted, strip_guidance


class MixPolicy:
    """Follows the reference with probability p (per episode, seeded), else says goodbye at once."""

    def __init__(self, p_by_level: dict[int, float], seed: int = 0):
        self.p_by_level = p_by_level
        self.seed = seed

    def begin(self, state):
        rng = random.Random(f"{self.seed}:{state.seed}:{state.trial}")
        env = state.env
        p = self.p_by_level[env.level + (env.knobs is not env.level_knobs)]  # a `mix` seed: the next level
        plan = list(state.env.reference_actions()) if rng.random() < p else []
        state.turns.append({"plan": plan})

    def act(self, states):
        return [
            [s.turns[0]["plan"].pop(0)] if s.turns[0]["plan"] else [{"content": "Goodbye."}] for s in states
        ]


def _r(seed, success, reward=None):
    return SimpleNamespace(seed=seed, success=success, reward=float(success) if reward is None else reward)


def test_group_stats_and_judge():
    res = [_r(0, 1), _r(0, 1), _r(1, 0), _r(1, 0, 0.5), _r(2, 1), _r(2, 0)]
    s = group_stats(res)
    assert s["mean_success"] == 0.5 and s["frac_all1"] == 1 / 3 and s["frac_all0"] == 1 / 3
    assert s["frac_constant_reward"] == 1 / 3  # seed 1 has rewards 0 and 0.5: not constant
    assert judge({"mean_success": 0.4, "frac_all0": 0.1, "frac_all1": 0.1}, Band()) == (True, None)
    assert judge({"mean_success": 0.9, "frac_all0": 0.0, "frac_all1": 0.8}, Band()) == (False, "harder")
    assert judge({"mean_success": 0.1, "frac_all0": 0.8, "frac_all1": 0.0}, Band()) == (False, "easier")
    assert judge({"mean_success": 0.4, "frac_all0": 0.0, "frac_all1": 0.5}, Band()) == (False, "harder")
    assert judge({"mean_success": 0.45, "frac_all0": 0.5, "frac_all1": 0.4}, Band()) == (
        False,
        "harder",
    )  # bimodal


# calibrate takes these from the synthesize config (`max_turns`, `calibration`); what these tests ran with
RUN = {"max_turns": 12, "batch_size": 64, "z": 2.0}


def _run(p_by_level, start_level=2, attempts=5, look=0, **kw):
    cls = get_template("precondition_verification")
    kw = {"hint_share": 0.0, "min_seeds": 16} | RUN | kw
    return calibrate(
        **kw,
        factory_for=lambda params: lambda: cls(**params),
        params={"level": start_level},
        policy_for=lambda i: MixPolicy(p_by_level, seed=i),
        seeds=list(range(24)),
        rollouts=8,
        max_attempts=attempts,
        harder=cls.harder,
        easier=cls.easier,
        look=look,
    )


def test_in_band_policy_passes_first_time():
    cal = _run({lv: 0.4 for lv in range(7)})
    assert cal.passed and len(cal.attempts) == 1
    a = cal.attempts[0]
    assert 0.2 <= a.mean_success <= 0.6 and a.frac_all0 <= 0.2 and a.frac_all1 <= 0.2 and a.in_band
    assert len(cal.results) == 24 * 8


def test_too_easy_moves_harder_until_in_band():
    cal = _run({0: 1.0, 1: 1.0, 2: 0.95, 3: 0.9, 4: 0.45, 5: 0.1, 6: 0.0})
    assert cal.passed
    assert [a.params["level"] for a in cal.attempts] == [2, 3, 4]
    assert [a.next for a in cal.attempts] == ["harder", "harder", ""]
    assert cal.params == {"level": 4}


def test_too_hard_moves_easier_and_gives_up_at_the_end():
    cal = _run({lv: 0.0 for lv in range(7)}, start_level=1)
    assert not cal.passed
    assert [a.params["level"] for a in cal.attempts] == [1, 0]
    assert "easiest" in cal.attempts[-1].next
    assert "success 0.000" in cal.summary()
    cal = _run({lv: 1.0 for lv in range(7)}, start_level=0, attempts=3)
    assert not cal.passed and len(cal.attempts) == 3 and cal.attempts[-1].next == "no attempts left"


def test_back_and_forth_stops_early():
    cal = _run({lv: (0.95 if lv <= 2 else 0.05) for lv in range(7)}, attempts=5)
    assert not cal.passed and [a.params["level"] for a in cal.attempts] == [2, 3]
    assert "measured already" in cal.attempts[-1].next


def test_sequential_test_stops_when_the_decision_is_clear_and_charges_what_ran():
    # hopeless at every level: each attempt is clearly out of band as soon as 16 seeds (4 looks) ran, not before
    cal = _run({lv: 0.0 for lv in range(7)}, start_level=1, look=4)
    assert not cal.passed and [a.seeds for a in cal.attempts] == [16, 16]
    assert all(a.decided == "clear after 16 seeds" for a in cal.attempts)
    assert cal.rollouts_run == 2 * 16 * 8 and len(cal.results) == 16 * 8
    # a borderline policy is not decided early: it runs every seed, and the point estimates decide
    cal = _run({lv: 0.22 for lv in range(7)}, look=4)
    assert cal.attempts[0].seeds == 24 and cal.attempts[0].decided == "all seeds"
    # clearly in band (every seed succeeds about half the time) stops before the last seed
    cal = _run({lv: 0.4 for lv in range(7)}, look=8)
    assert cal.passed and cal.attempts[0].seeds in (16, 24)
    assert cal.rollouts_run == cal.attempts[0].seeds * 8


def test_clear_decision_intervals():
    from trace_cli.envs.synthetic.calibrate import clear_decision

    half = [_r(s, t % 2) for s in range(24) for t in range(8)]  # every group half right
    assert clear_decision(half, Band(), 2.0, 16) == (True, None)
    # with 16 groups and none all-0, the all-0 share could still be above 0.2 (Agresti-Coull): not yet clear
    assert clear_decision(half[: 16 * 8], Band(), 2.0, 16) is None
    none = [_r(s, 0) for s in range(16) for t in range(8)]
    assert clear_decision(none, Band(), 2.0, 16) == (False, "easier")
    assert clear_decision(none[: 15 * 8], Band(), 2.0, 16) is None  # no decision before 16 seeds
    few = [_r(s, t % 2) for s in range(3) for t in range(8)]  # too few groups for the all-0 share to be clear
    assert clear_decision(few, Band(), 2.0, 16) is None


def test_constant_groups_are_judged_on_the_reward():
    # seed 0 never succeeds but its graded rewards vary (a learning signal); seed 1 is constant at 0.4
    res = [_r(0, 0, 0.2 * t) for t in range(4)] + [_r(1, 0, 0.4) for _ in range(4)]
    s = group_stats(res)
    assert s["frac_all0"] == 1.0 and s["frac_constant_low"] == 0.5
    stats = {"mean_success": 0.3, "frac_all1": 0.0}
    assert judge({**stats, "frac_all0": 1.0, "frac_constant_low": 0.1}, Band()) == (True, None)
    assert judge({**stats, "frac_all0": 1.0, "frac_constant_low": 0.3}, Band()) == (False, "easier")


def test_bimodal_between_adjacent_levels_is_bisected():
    cls = get_template("precondition_verification")
    p = {1: 0.75, 2: 0.15}  # level 1 too easy, level 2 too hard: the band lies between them
    without = _run(p, start_level=1, attempts=6)
    assert not without.passed and "measured already" in without.attempts[-1].next
    cal = _run(p, start_level=1, attempts=6, between=cls.between)
    assert [a.params for a in cal.attempts[:3]] == [{"level": 1}, {"level": 2}, {"level": 1, "mix": 0.5}]
    assert cal.passed and cal.params["level"] == 1 and 0 < cal.params["mix"] < 1
    assert "between" in cal.attempts[1].next
    env = cls(**cal.params)
    assert env.params["mix"] == cal.params["mix"]  # the admitted setting is an environment's own params


class HintReader(MixPolicy):
    """Solves a task when its system prompt carries that task's hint; otherwise with probability p."""

    def begin(self, state):
        super().begin(state)
        hint = guidance(state.env.reference_actions())
        if hint in state.messages[0]["content"]:
            state.turns[0]["plan"] = list(state.env.reference_actions())


def test_hints_admit_a_level_the_policy_cannot_solve_alone():
    cls = get_template("precondition_verification")
    kw = {"harder": cls.harder, "easier": cls.easier, "between": cls.between}
    cal = calibrate(
        factory_for=lambda params: lambda: cls(**params),
        params={"level": 3},
        policy_for=lambda i: HintReader({lv: 0.05 for lv in range(7)}, seed=i),
        seeds=list(range(24)),
        rollouts=8,
        hint_share=0.25,
        min_seeds=16,
        max_attempts=5,
        look=0,
        **RUN,
        **kw,
    )
    assert [a.params for a in cal.attempts] == [{"level": 3}, {"level": 3, "hint_share": 0.25}]
    assert cal.passed and cal.params == {"level": 3, "hint_share": 0.25}  # the level kept, not made easier
    a = cal.attempts[-1]
    assert a.hint_share == 0.25 and a.mean_success_unhinted < 0.15 and a.mean_success >= 0.25
    assert cal.attempts[0].frac_constant_low > 0.5 and a.frac_constant_low <= 0.2
    hinted_prompts = {r.trial < 2 for r in cal.results if OPEN in r.messages[0]["content"]}
    assert hinted_prompts == {True}  # 2 of each group's 8 rollouts saw the hint, and only those


def test_the_hint_is_the_reference_and_strips_back_to_the_original_prompt():
    env = get_template("structured_data_reasoning")()
    plain = env.reset(5)
    obs = HintedEnv(env).reset(5)
    assert (
        obs.system_prompt != plain.system_prompt and strip_guidance(obs.system_prompt) == plain.system_prompt
    )
    assert obs.info["prompt_without_guidance"] == plain.system_prompt
    ids = [a["arguments"] for a in env.reference_actions() if a.get("name") == "return_delivered_order_items"]
    assert ids and all(json.dumps(x) in obs.system_prompt for x in ids[0]["item_ids"])
    assert hinted(0.25, 8) == 2 and hinted(0.5, 8) == 4 and hinted(0.25, 1) == 0 and hinted(0.0, 8) == 0
