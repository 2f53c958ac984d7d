"""The `openai` analyst against a real HTTP server on loopback (scripted answers), through the openai SDK:
retries on malformed JSON, 5xx and timeouts (the SDK's), dropped parameters, ERROR labels when answers stay
invalid, fail-fast on 401, bounded concurrency, the response cache, the API key never reaching the store,
and the environment author on the same client."""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml
from analyst_helpers import EpisodeBuilder, labels_answer, small_episodes
from trace_testing import run_cli, write_jsonl

from trace_cli.analysts.base import ERROR, LACKING, PRESENT, Candidate
from trace_cli.analysts.openai import OpenAIAnalyst
from trace_cli.errors import UsageError
from trace_cli.stages.base import execute
from trace_cli.store import Store

CAPS = [
    Candidate("precondition_verification", "Reading an object before changing it. Needed for any write."),
    Candidate("tone_and_empathy", "Courteous phrasing. Needed whenever the agent writes to the user."),
]
NAMES = [c.name for c in CAPS]


def cfg(server, **llm):
    return {
        "llm": {
            "base_url": server.url,
            "model": "scripted-model",
            "timeout_s": 5,
            "max_retries": 2,
            "concurrency": 4,
            **llm,
        }
    }


def one_episode():
    return small_episodes(1, 0)


def test_valid_answer_and_request_shape(llm_server, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    a = OpenAIAnalyst(cfg(llm_server), Store(tmp_path / "s"))
    labels = a.label(one_episode(), CAPS, run=1, seed=11)
    assert [(lb.episode_id, lb.capability, lb.run, lb.label) for lb in labels] == [
        ("e0", "precondition_verification", 1, PRESENT),
        ("e0", "tone_and_empathy", 1, PRESENT),
    ]
    (req,) = llm_server.requests
    assert req["path"] == "/v1/chat/completions"
    body = req["json"]
    assert body["model"] == "scripted-model" and body["seed"] == 11
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0.7 and body["max_tokens"] == 1024
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Authorization" not in req["headers"]  # no key set: no header (local servers need none)


def test_malformed_json_then_valid(llm_server):
    llm_server.script.extend([("text", "Sure! {labels: [oops"), ("text", '```json\n{"labels": 3}\n```')])
    labels = OpenAIAnalyst(cfg(llm_server)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 3
    assert {lb.label for lb in labels} == {PRESENT}
    # a retry sends another seed, so a seeded server does not repeat its bad answer
    assert len({r["json"]["seed"] for r in llm_server.requests}) == 3


def test_server_error_then_valid(llm_server):
    llm_server.script.append(("status", 500, {"error": {"message": "overloaded"}}))
    llm_server.script.append(("status", 429, {"error": {"message": "slow down"}}))
    labels = OpenAIAnalyst(cfg(llm_server)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 3 and {lb.label for lb in labels} == {PRESENT}


def test_timeout_then_valid(llm_server):
    llm_server.script.append(lambda req: ("sleep", 1.5, ("text", labels_answer(req))))
    t0 = time.monotonic()
    labels = OpenAIAnalyst(cfg(llm_server, timeout_s=0.3)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 2 and {lb.label for lb in labels} == {PRESENT}
    assert time.monotonic() - t0 < 1.4  # did not wait for the slow answer


def test_the_sdk_retries_transport_failures_within_the_budget(llm_server):
    """Retries of 5xx are the SDK's (its retry-count header counts them), bounded by llm.max_retries; a
    server that stays down gives ERROR labels naming the status."""
    llm_server.script.extend([("status", 503, {"error": {"message": "warming up"}})] * 2)
    labels = OpenAIAnalyst(cfg(llm_server)).label(one_episode(), CAPS, 0, 0)
    assert {lb.label for lb in labels} == {PRESENT}
    assert [r["headers"]["x-stainless-retry-count"] for r in llm_server.requests] == ["0", "1", "2"]
    llm_server.default = lambda req: ("status", 503, {"error": {"message": "still down"}})
    labels = OpenAIAnalyst(cfg(llm_server, max_retries=1)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 3 + 2
    assert [lb.label for lb in labels] == [ERROR, ERROR]
    assert "after 2 attempt(s)" in labels[0].rationale and "HTTP 503: still down" in labels[0].rationale


def test_a_parameter_the_server_rejects_is_dropped(llm_server):
    """A server without JSON mode answers 400 naming response_format: ask again without it (and keep it off)."""
    llm_server.script.append(
        (
            "status",
            400,
            {"error": {"message": "response_format is not supported", "type": "invalid_request_error"}},
        )
    )
    # one request at a time: with concurrent requests, a second one could be sent (with the parameter) before
    # the first one's 400 arrives, and the order of requests would be a race
    a = OpenAIAnalyst(cfg(llm_server, concurrency=1))
    labels = a.label(small_episodes(2, 0), CAPS, 0, 0)
    assert {lb.label for lb in labels} == {PRESENT}
    assert llm_server.count == 3
    assert "response_format" in llm_server.requests[0]["json"]
    assert all("response_format" not in r["json"] for r in llm_server.requests[1:])
    assert all(r["json"]["seed"] == 0 for r in llm_server.requests)


def test_answers_that_stay_invalid_become_error_labels(llm_server):
    llm_server.default = lambda req: ("text", "I think the agent did fine overall.")
    labels = OpenAIAnalyst(cfg(llm_server, max_retries=2)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 3
    assert [lb.label for lb in labels] == [ERROR, ERROR]
    assert "after 3 attempt(s)" in labels[0].rationale and "invalid answer" in labels[0].rationale


def test_unknown_capabilities_ignored_missing_ones_error(llm_server):
    ans = {
        "labels": [
            {"capability": "telepathy", "label": "LACKING", "rationale": "?"},
            {"capability": "precondition_verification", "label": "LACKING", "rationale": "no read"},
        ]
    }
    llm_server.default = lambda req: ("text", json.dumps(ans))
    labels = OpenAIAnalyst(cfg(llm_server)).label(one_episode(), CAPS, 0, 0)
    assert llm_server.count == 1
    assert [(lb.capability, lb.label) for lb in labels] == [
        ("precondition_verification", LACKING),
        ("tone_and_empathy", ERROR),
    ]


@pytest.mark.parametrize(
    "code, text, hint",
    [
        (401, "Invalid API key provided", "TRACE_TEST_KEY"),
        (404, "The model `scripted-model` does not exist", "--llm-model"),
    ],
)
def test_client_errors_fail_fast(llm_server, code, text, hint):
    llm_server.default = lambda req: (
        "status",
        code,
        {"error": {"message": text, "type": "invalid_request_error"}},
    )
    with pytest.raises(UsageError) as ei:
        OpenAIAnalyst(cfg(llm_server, api_key_env="TRACE_TEST_KEY")).label(small_episodes(2, 2), CAPS, 0, 0)
    msg = str(ei.value)
    assert f"HTTP {code}" in msg and text in msg and hint in msg
    assert ei.value.exit_code == 2
    assert llm_server.count <= 4  # no retries of a 4xx


def test_unreachable_server_is_a_usage_error():
    with pytest.raises(UsageError, match="cannot reach"):
        OpenAIAnalyst({"llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 1}}).label(
            one_episode(), CAPS, 0, 0
        )


def test_concurrency_is_bounded(llm_server):
    llm_server.default = lambda req: ("sleep", 0.15, ("text", labels_answer(req)))
    eps = small_episodes(6, 6)
    labels = OpenAIAnalyst(cfg(llm_server, concurrency=3)).label(eps, CAPS, 0, 0)
    assert llm_server.count == 12 and len(labels) == 24
    assert 2 <= llm_server.max_in_flight <= 3
    assert [lb.episode_id for lb in labels[::2]] == [e["episode_id"] for e in eps]  # input order kept


def test_runs_and_seeds_enter_the_request_and_the_cache_key(llm_server, tmp_path):
    store = Store(tmp_path / "s")
    a = OpenAIAnalyst(cfg(llm_server), store)
    a.label(one_episode(), CAPS, 0, 5)
    a.label(one_episode(), CAPS, 1, 6)
    assert llm_server.count == 2
    assert [r["json"]["seed"] for r in llm_server.requests] == [5, 6]
    assert len(list((store.root / "cache" / "openai").glob("*.json"))) == 2
    OpenAIAnalyst(cfg(llm_server), store).label(one_episode(), CAPS, 1, 6)  # a new analyst, same request
    assert llm_server.count == 2
    OpenAIAnalyst(cfg(llm_server, cache=False), store).label(one_episode(), CAPS, 1, 6)
    assert llm_server.count == 3


def test_discovery(llm_server):
    ans = {
        "candidates": [
            {
                "name": "read_before_write",
                "description": "Reading the object before changing it.",
                "example_task_ids": ["task0", "task5", "nope"],
            }
        ]
    }
    llm_server.script.extend([("text", "no idea"), ("text", json.dumps(ans))])
    cands = OpenAIAnalyst(cfg(llm_server)).discover(small_episodes(), 10, 0)
    assert [c.name for c in cands] == ["read_before_write"]
    assert cands[0].examples == [{"task_id": "task0"}, {"task_id": "task5"}]
    prompt = llm_server.requests[0]["json"]["messages"][1]["content"]
    assert "FAILED EPISODES" in prompt and "task0: FAILURE" in prompt and "task5: SUCCESS" in prompt


def test_discovery_that_stays_invalid_is_a_usage_error(llm_server):
    llm_server.default = lambda req: ("text", "{}")
    with pytest.raises(UsageError, match="discovery failed"):
        OpenAIAnalyst(cfg(llm_server, max_retries=1)).discover(small_episodes(), 10, 0)


# ------------------------------------------------------------------ the environment author shares the client


def test_env_author_asks_through_the_same_client(llm_server, monkeypatch):
    from trace_cli.envs.authoring import author_messages, write_module

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    src = "def make_env(**params):\n    return None\n"
    llm_server.script.extend([("text", "no module here"), ("text", json.dumps({"module": src}))])
    msgs = author_messages("precondition_verification", "Read before writing.", [], [])
    llm = {"base_url": llm_server.url, "model": "author-model", "max_retries": 2, "temperature": 0.2}
    assert write_module("openai", llm, None, msgs, seed=7, attempt=1) == (src, None)
    first, second = (r["json"] for r in llm_server.requests)
    assert llm_server.requests[0]["path"] == "/v1/chat/completions"
    assert first["model"] == "author-model" and first["temperature"] == 0.2 and first["seed"] == 7
    assert first["response_format"] == {"type": "json_object"} and first["messages"] == msgs
    assert second["seed"] != 7  # an invalid answer is asked again with another seed
    assert "Authorization" not in llm_server.requests[0]["headers"]


def test_env_author_errors_exit_2(llm_server):
    from trace_cli.envs.authoring import write_module

    msgs = [{"role": "user", "content": "write"}]
    with pytest.raises(UsageError, match="cannot reach") as ei:
        write_module(
            "openai",
            {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0},
            None,
            msgs,
            seed=0,
            attempt=1,
        )
    assert ei.value.exit_code == 2
    llm_server.default = lambda req: ("status", 401, {"error": {"message": "Invalid API key provided"}})
    with pytest.raises(UsageError, match="HTTP 401") as ei:
        write_module("openai", {"base_url": llm_server.url, "model": "m"}, None, msgs, seed=0, attempt=1)
    assert ei.value.exit_code == 2 and llm_server.count == 1


# ------------------------------------------------------------------ through the stage and the CLI


@pytest.fixture
def rollouts(tmp_path):
    """A rollouts artifact of 8 short episodes (4 failed: a write without reading first)."""
    root = tmp_path / "store"
    recs = [
        EpisodeBuilder(
            e["episode_id"], success=e["success"], task_id=e["task_id"], reference=e["reference_actions"]
        )
        for e in small_episodes(4, 4)
    ]
    for b, e in zip(recs, small_episodes(4, 4), strict=True):
        b.messages = e["messages"]
    path = write_jsonl(tmp_path / "eps.jsonl", [b.record() for b in recs])
    execute("ingest", {"format": "jsonl", "path": str(path)}, Store(root), name="eps")
    return root


def _precondition_from_transcript(cap: str, episode: str) -> str:
    if cap != "precondition_verification":
        return PRESENT
    return PRESENT if "calls get_order" in episode else LACKING


def test_diagnose_cli_with_openai_cache_and_no_key_in_store(llm_server, rollouts, monkeypatch):
    secret = "sk-test-DO-NOT-STORE-4f9a1c"
    monkeypatch.setenv("TRACE_TEST_KEY", secret)
    llm_server.default = lambda req: ("text", labels_answer(req, _precondition_from_transcript))
    args = [
        "diagnose",
        "--rollouts",
        "store://rollouts/eps",
        "--analyst",
        "openai",
        "--base-url",
        llm_server.url,
        "--llm-model",
        "scripted-model",
        "--api-key-env",
        "TRACE_TEST_KEY",
        "--runs",
        "3",
        "--min-runs",
        "2",
        "--capability",
        "precondition_verification",
        "--capability",
        "tone_and_empathy",
        "--concurrency",
        "4",
        "--json",
        "--store",
        str(rollouts),
    ]
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [c["name"] for c in doc["selected"]] == ["precondition_verification"]
    assert doc["selected"][0]["mean_delta"] == 1.0 and doc["selected"][0]["runs_passed"] == 3
    assert [c["name"] for c in doc["rejected"]] == ["tone_and_empathy"]
    assert llm_server.count == 3 * 8  # one request per episode per run
    assert {r_["headers"].get("Authorization") for r_ in llm_server.requests} == {f"Bearer {secret}"}
    assert {r_["json"]["seed"] for r_ in llm_server.requests} == {0, 1, 2}

    # same requests, other thresholds (a new artifact): every answer comes from the cache
    r2 = run_cli(*args[:-3], "--delta-min", "0.5", "--json", "--store", str(rollouts))
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.stdout)["id"] != doc["id"]
    assert llm_server.count == 3 * 8

    root = rollouts
    cached = list((root / "cache" / "openai").glob("*.json"))
    assert len(cached) == 3 * 8
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert secret.encode() not in data, p
    manifest = yaml.safe_load((root / "diagnosis" / doc["id"] / "manifest.yaml").read_text())
    assert manifest["config"]["llm"]["api_key_env"] == "TRACE_TEST_KEY"


def test_diagnose_with_a_flaky_server_records_error_labels(llm_server, rollouts):
    calls = {"n": 0}
    lock = threading.Lock()

    def answer(req):
        with lock:
            calls["n"] += 1
        if "task0:" in req["messages"][-1]["content"]:
            return ("text", "garbage")  # this episode never gets a valid answer
        return ("text", labels_answer(req, _precondition_from_transcript))

    llm_server.default = answer
    out = execute(
        "diagnose",
        {
            "rollouts": "store://rollouts/eps",
            "analyst": "openai",
            "runs": 2,
            "min_runs": 1,
            "capabilities": NAMES,
            "llm": {"base_url": llm_server.url, "model": "m", "max_retries": 1},
        },
        Store(rollouts),
    )
    a = out.main
    assert a.summary["label_errors"] == 2 * 2  # task0 × 2 capabilities × 2 runs
    r = run_cli(
        "store",
        "sql",
        "select label, count(*) as n from labels where analyst = 'openai' group by all order by label",
        "--json",
        "--store",
        str(rollouts),
    )
    assert r.exit_code == 0, r.output
    counts = {x["label"]: x["n"] for x in json.loads(r.stdout)}
    assert counts[ERROR] == 4 and sum(counts.values()) == 8 * 2 * 2
    doc = yaml.safe_load((a.path / "capabilities.yaml").read_text())
    assert [c["name"] for c in doc["selected"]] == ["precondition_verification"]  # errors left out of counts
