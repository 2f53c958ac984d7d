"""Prompts, response schemas, the tolerant JSON extraction and the response cache."""

from __future__ import annotations

import json

import pytest

from trace_cli.analysts import prompts
from trace_cli.analysts.base import ERROR, Candidate, Trajectory
from trace_cli.analysts.cache import ResponseCache, request_key
from trace_cli.analysts.prompts import AnalystResponseError, PromptLimits
from trace_cli.store import Store

CAPS = [
    Candidate("precondition_verification", "Checking state before changing it. Needed for writes."),
    Candidate("multi_step_completion", "Finishing every operation of a request. Needed for 2+ writes."),
]
GOOD = {
    "labels": [
        {"capability": "precondition_verification", "label": "LACKING", "rationale": "cancelled unread"},
        {"capability": "multi_step_completion", "label": "NA", "rationale": "one write"},
    ]
}


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(GOOD),
        "```json\n" + json.dumps(GOOD, indent=2) + "\n```",
        "Here is my analysis {not json}.\n```\n" + json.dumps(GOOD) + "\n```\nHope this helps!",
        "Sure! " + json.dumps(GOOD) + " Let me know if {anything} else.",
        "<think>The agent {did} not read.</think>\n" + json.dumps(GOOD),
    ],
)
def test_extract_json_tolerates_fences_and_prose(text):
    assert prompts.extract_json(text) == GOOD


@pytest.mark.parametrize(
    "text", ["", "   ", None, "no json here", "{'single': 'quotes'}", "[1, 2]", '{"a": ']
)
def test_extract_json_raises_a_specific_error(text):
    with pytest.raises(AnalystResponseError):
        prompts.extract_json(text)


def test_parse_labels_normalises_and_ignores_unknown():
    ans = {
        "labels": [
            {"capability": "Precondition Verification", "label": "lacking", "rationale": "  no  read "},
            {"capability": "telepathy", "label": "PRESENT"},
            {"capability": "precondition_verification", "label": "PRESENT"},
        ]
    }  # repeat: first wins
    out = prompts.parse_labels(json.dumps(ans), [c.name for c in CAPS])
    assert out == {"precondition_verification": ("LACKING", "no read")}
    labels = prompts.to_labels("e1", [c.name for c in CAPS], 2, out, None)
    assert [(lb.capability, lb.label, lb.run) for lb in labels] == [
        ("precondition_verification", "LACKING", 2),
        ("multi_step_completion", ERROR, 2),
    ]
    assert "did not label" in labels[1].rationale


@pytest.mark.parametrize(
    "ans, match",
    [
        ({"labels": [{"capability": "precondition_verification", "label": "MAYBE"}]}, "schema"),
        ({"labels": []}, "schema"),
        ({"answer": "PRESENT"}, "schema"),
        ({"labels": [{"capability": "telepathy", "label": "NA"}]}, "none of the capabilities"),
    ],
)
def test_parse_labels_rejects_bad_answers(ans, match):
    with pytest.raises(AnalystResponseError, match=match):
        prompts.parse_labels(json.dumps(ans), [c.name for c in CAPS])


def test_parse_discovery():
    ans = {
        "candidates": [
            {
                "name": "verify-before-write",
                "description": "Reading an object before changing it. Needed for writes.",
                "example_task_ids": [3, "7", "999"],
            },
            {
                "name": "verify_before_write",
                "description": "A duplicate name that should be dropped entirely.",
            },
            {"name": "finish_all_steps", "description": "Completing every operation the request needs."},
            {"name": "third_one_here", "description": "Beyond max_candidates, so it is cut off."},
        ]
    }
    cands = prompts.parse_discovery("```json\n" + json.dumps(ans) + "\n```", 2, {"3", "7"})
    assert [c.name for c in cands] == ["verify_before_write", "finish_all_steps"]
    assert cands[0].examples == [{"task_id": "3"}, {"task_id": "7"}]
    for bad in (
        {"candidates": [{"name": "x", "description": "too short name of one word only"}]},
        {"candidates": [{"name": "a_b", "description": "short"}]},
        {"candidates": []},
    ):
        with pytest.raises(AnalystResponseError):
            prompts.parse_discovery(json.dumps(bad), 5)


def test_schemas_accept_their_own_examples():
    from jsonschema import Draft202012Validator

    Draft202012Validator(prompts.LABELS_SCHEMA).validate(GOOD)
    Draft202012Validator(prompts.DISCOVERY_SCHEMA).validate(
        {"candidates": [{"name": "a_b", "description": "x" * 20, "example_task_ids": ["1", 2]}]}
    )


def _long_traj(ep, n=200, success=False, eid="long"):
    b = ep(
        eid,
        success=success,
        task_id=eid,
        reference=[{"name": "cancel_order", "arguments": {"order_id": "#W1"}}],
    )
    b.user("Cancel #W1 please.")
    for i in range(n):
        b.call("get_order", {"order_id": f"#W{i}"}, "x" * 2000)
    b.agent("FINAL MESSAGE")
    return Trajectory.from_episode(b.build())


def test_labelling_prompt_is_bounded_and_complete(ep):
    t = _long_traj(ep)
    limits = PromptLimits(max_result_chars=50, max_trajectory_chars=3000)
    msgs = prompts.labelling_messages(t, CAPS, limits)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    episode = user.split("=== EPISODE ===")[1]
    assert len(episode) <= 3000 + 2
    assert "task long: FAILURE" in episode  # the head survives the cut
    assert "reference actions: cancel_order" in episode  # and so does the tail
    assert "characters omitted" in episode
    assert "x" * 51 not in user  # tool results capped
    for c in CAPS:
        assert f"- {c.name}: " in user
    assert "PRESENT" in user and "LACKING" in user and '"labels"' in user


def test_discovery_prompt_is_bounded_and_mixes_outcomes(ep):
    trajs = [_long_traj(ep, 30, success=i % 2 == 0, eid=f"t{i}") for i in range(20)]
    limits = PromptLimits(max_result_chars=100, max_trajectory_chars=4000, max_discovery_chars=12000)
    msgs = prompts.discovery_messages(trajs, 7, limits)
    user = msgs[1]["content"]
    body = user.split("=== FAILED EPISODES ===")[1]
    assert len(body) <= 12000 + 200
    failed, passed = body.split("=== PASSED EPISODES ===")
    assert ": FAILURE" in failed and ": SUCCESS" not in failed
    assert ": SUCCESS" in passed
    assert "more episodes omitted" in user
    assert "at most 7 candidate capabilities" in user and "snake_case" in user


def test_limits_from_config():
    assert PromptLimits.from_config(None) == PromptLimits()
    assert PromptLimits.from_config({"max_trajectory_chars": 500}).max_trajectory_chars == 500


# ------------------------------------------------------------------ cache


def test_cache_roundtrip_atomic_and_keyed_without_secrets(tmp_path):
    store = Store(tmp_path / "s")
    cache = ResponseCache.for_store(store, "openai")
    req = {
        "path": "/v1/chat/completions",
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.7,
        "max_tokens": 10,
        "seed": 1,
        "run": 0,
    }
    key = request_key(req)
    assert key == request_key(
        {**req, "headers": {"Authorization": "Bearer sk-secret"}, "api_key": "sk-secret"}
    )
    assert key != request_key({**req, "run": 1}) != request_key({**req, "seed": 2})
    assert cache.get(key) is None
    cache.put(key, {**req, "api_key": "sk-secret"}, '{"labels": []}')
    p = store.root / "cache" / "openai" / f"{key}.json"
    assert p.is_file()
    assert cache.get(key)["text"] == '{"labels": []}'
    assert "sk-secret" not in p.read_text()
    assert [x.name for x in p.parent.iterdir()] == [p.name]  # no temp file left behind
    p.write_text("{corrupt")
    assert cache.get(key) is None
    assert ResponseCache.for_store(store, "openai", enabled=False) is None
    assert ResponseCache.for_store(None, "openai") is None
