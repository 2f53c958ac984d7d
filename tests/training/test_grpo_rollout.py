"""The GRPO rollout path without a trainer: seed prompts, token-history policy on the shared rollout loop,
episode sequences (completion = model tokens + environment tokens with env_mask), the episode token budget."""

from __future__ import annotations

import pytest
from grpo_helpers import set_env, tiny_model

from trace_cli.agents.token_history import BUDGET_ERROR, TokenPolicy, episode_sequence
from trace_cli.envs.registry import make_env
from trace_cli.envs.rollout import rollout
from trace_cli.models.chat import render
from trace_cli.training.grpo_rollout import parse_seed, seed_prompt


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    set_env()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model(tmp_path_factory))


def canonical_turn(tok, messages, tools, action) -> str:
    """The text the chat template gives `action` as the next assistant turn (through its end-of-turn token)."""
    if "name" in action:
        msg = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": action["name"], "arguments": action["arguments"]},
                }
            ],
        }
    else:
        msg = {"role": "assistant", "content": action["content"]}
    head = render(tok, messages, tools, add_generation_prompt=True)
    full = render(tok, messages + [msg], tools, add_generation_prompt=False)
    assert full.startswith(head)
    body = full[len(head) :]
    return body[: body.rindex("<|im_end|>") + len("<|im_end|>")]


class ScriptedPolicy(TokenPolicy):
    """A TokenPolicy whose 'model' emits each episode's reference solution, token by token as the template
    renders it (what a well-trained agent produces)."""

    def __init__(self, tok, **kw):
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0}  # unused: the script generates
        super().__init__(None, tok, generate_fn=self._scripted, **sampling, **kw)
        self._states = []

    def begin(self, state):
        state.plan = list(state.env.reference_actions())

    def act(self, states):
        self._states = [s for s in states]
        return super().act(states)

    def _scripted(self, ctxs, max_new):
        out = []
        live = [s for s in self._states if not s.done]
        assert len(live) == len(ctxs)
        for s in live:
            action = s.plan.pop(0) if s.plan else {"content": "Goodbye."}
            text = canonical_turn(self.tok, s.messages, s.tools, action)
            out.append(self.tok(text, add_special_tokens=False)["input_ids"])
        return out, None


def test_seed_prompt_round_trip():
    assert parse_seed(seed_prompt(123)) == 123
    with pytest.raises(ValueError, match="trace-seed"):
        parse_seed("hello")
    with pytest.raises(ValueError):
        parse_seed([{"role": "user", "content": "x"}])


def test_token_history_equals_rerendered_conversation(tok):
    """Prefix preservation, verified: with canonical agent output, the context the policy built from tokens at
    every turn equals the re-rendered conversation (what `trace eval`'s HFPolicy sees), and the whole episode
    sequence equals the tokenized final transcript; env_mask is 1 exactly on the agent's turns."""
    policy = ScriptedPolicy(tok, budget=10_000, max_new_tokens=10_000)
    results = rollout(
        policy, lambda: make_env("shop"), [(s, 0) for s in range(6)], max_turns=30, batch_size=4
    )
    assert all(r.reward == 1.0 for r in results), [r.termination for r in results]
    for r in results:
        asst = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
        assert len(asst) == len(r.turns) >= 2
        for i, t in zip(asst, r.turns, strict=True):
            rerendered = tok(
                render(tok, r.messages[:i], r.tools, add_generation_prompt=True), add_special_tokens=False
            )["input_ids"]
            assert t["prompt_ids"] == rerendered
        seq = episode_sequence(r.turns, policy.eos_id)
        full = render(tok, r.messages[: asst[-1] + 1], r.tools, add_generation_prompt=False)
        full = full[: full.rindex("<|im_end|>") + len("<|im_end|>")]
        assert seq["prompt_ids"] + seq["completion_ids"] == tok(full, add_special_tokens=False)["input_ids"]
        assert len(seq["env_mask"]) == len(seq["completion_ids"])
        agent = [tid for tid, m in zip(seq["completion_ids"], seq["env_mask"], strict=True) if m]
        assert agent == [tid for t in r.turns for tid in t["completion_ids"]]
        assert seq["env_mask"][0] == 1 and 0 in seq["env_mask"]  # starts with the agent; env tokens between


def test_episode_budget_ends_episode_without_stepping_env(tok):
    budget = 60
    policy = ScriptedPolicy(tok, budget=budget, max_new_tokens=40)
    results = rollout(
        policy, lambda: make_env("shop"), [(s, 0) for s in range(4)], max_turns=30, batch_size=4
    )
    for r in results:
        seq = episode_sequence(r.turns, policy.eos_id)
        assert len(seq["completion_ids"]) <= budget
        if r.termination == "max_length":
            assert r.messages[-1]["role"] == "tool" and BUDGET_ERROR in r.messages[-1]["content"]
    assert any(r.termination == "max_length" for r in results)


def test_episode_sequence_checks_prefixes():
    turns = [
        {"prompt_ids": [1, 2], "completion_ids": [3, 9]},
        {"prompt_ids": [1, 2, 3, 9, 7, 7], "completion_ids": [4]},
    ]
    seq = episode_sequence(turns, eos_id=9)
    assert seq == {
        "prompt_ids": [1, 2],
        "completion_ids": [3, 9, 7, 7, 4],
        "env_mask": [1, 1, 0, 0, 1],
        "logprobs": [0.0] * 5,
    }
    with pytest.raises(ValueError, match="does not extend"):
        episode_sequence([turns[0], {"prompt_ids": [1, 2, 5], "completion_ids": [4]}], eos_id=9)
    assert episode_sequence([], eos_id=9)["env_mask"] == [0]


def test_truncated_turn_is_closed_with_an_env_eos(tok):
    """A turn cut at max_new_tokens has no end-of-turn token; the next context adds it as an env token."""

    class Chatty(ScriptedPolicy):
        def _scripted(self, ctxs, max_new):
            # an unterminated tool call: answered with a tool error, so the episode goes on
            call = tok("<tool_call>", add_special_tokens=False)["input_ids"]
            return [(call + [tok.convert_tokens_to_ids("a")] * max_new)[:max_new] for _ in ctxs], None

    policy = Chatty(tok, budget=200, max_new_tokens=5)
    [r] = rollout(policy, lambda: make_env("shop"), [(0, 0)], max_turns=2, batch_size=1)
    assert len(r.turns) == 2 and all(len(t["completion_ids"]) == 5 for t in r.turns)
    seq = episode_sequence(r.turns, policy.eos_id)
    env_part = seq["completion_ids"][5 : seq["env_mask"].index(1, 5)]
    assert env_part[0] == policy.eos_id


def test_hinted_episodes_are_sampled_with_the_hint_and_trained_on_the_original_prompt(tok):
    """Hint injection: the first `hints` episodes of each group see the task's <expert_guidance> block; their
    sequences carry the prompt without it (the one the unhinted episodes of the same seed have), and the same
    completion tokens as an unhinted episode that acts alike."""
    from trace_cli.envs.synthetic import get_template
    from trace_cli.envs.synthetic.hints import OPEN
    from trace_cli.training.grpo_rollout import group_episodes

    cls = get_template("structured_data_reasoning")
    policy = ScriptedPolicy(tok, budget=10_000, max_new_tokens=10_000)
    seeds = [3, 3, 3, 3, 8, 8, 8, 8]
    results, seqs = group_episodes(policy, lambda: cls(hint_share=0.5), seeds, 2, max_turns=30, batch_size=8)
    assert [r.seed for r in results] == seeds and all(r.reward == 1.0 for r in results)
    saw = [OPEN in r.messages[0]["content"] for r in results]
    assert saw == [True, True, False, False] * 2  # the first 2 of each group of 4
    for g in (0, 4):
        hinted_seq, plain_seq = seqs[g], seqs[g + 2]
        assert hinted_seq["prompt_ids"] == plain_seq["prompt_ids"]  # the gradient sees the original prompt
        assert hinted_seq["completion_ids"] == plain_seq["completion_ids"]
        assert results[g].turns[0]["prompt_ids"] != hinted_seq["prompt_ids"]  # sampled with the hint
        assert OPEN not in tok.decode(hinted_seq["prompt_ids"])


def test_a_mixture_hints_each_members_groups_with_that_members_share(tok, tmp_path):
    """GRPO on a mixture of environments (envs/mixture.py, the mixed-environment baseline): each group is one
    member's task, and its hinted episodes are that member's calibrated share (here 0.5 and none); the episode log
    marks exactly those as hinted."""
    from trace_cli.envs.mixture import MixtureEnv
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.synthetic import get_template
    from trace_cli.envs.synthetic.hints import OPEN, hinted
    from trace_cli.store.rollouts import read_episodes
    from trace_cli.training.episode_log import EpisodeLog, collect
    from trace_cli.training.grpo_rollout import group_episodes

    cls = get_template("structured_data_reasoning")

    def mixture():
        return MixtureEnv([cls(hint_share=0.5), make_env("shop")])

    env = mixture()
    hints_of = lambda seed: hinted(env.hint_share_of(seed), 4)  # noqa: E731 - what rollout_func builds
    policy = ScriptedPolicy(tok, budget=10_000, max_new_tokens=10_000)
    seeds = [6, 6, 6, 6, 7, 7, 7, 7]  # member 0 (hinted), then member 1 (the shop: no hints)
    results, _ = group_episodes(policy, mixture, seeds, hints_of, max_turns=30, batch_size=8)
    saw = [OPEN in r.messages[0]["content"] for r in results]
    assert saw == [True, True, False, False] + [False] * 4
    assert all(r.reward == 1.0 for r in results)  # the reference solves each member's task
    assert results[0].task_id != results[4].task_id and results[4].task_id.startswith("shop-")
    log = EpisodeLog(tmp_path / "eps", kept=8, max_steps=1, group=4)
    assert log.write(1, results, hints_of, "grpo") == 8
    collect(tmp_path / "eps", tmp_path)
    hinted_by_task = {(e["task_id"], e["info"]["hinted"]) for e in read_episodes(tmp_path)}
    assert sum(e["info"]["hinted"] for e in read_episodes(tmp_path)) == 2
    assert (results[4].task_id, True) not in hinted_by_task  # the shop's group: no hint
