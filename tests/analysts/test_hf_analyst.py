"""The `hf` analyst with a tiny random local model (built offline by `trace model init --preset tiny`): its
garbage answers must end as ERROR labels after the retries, never a crash; valid answers are parsed and
cached like the openai analyst's."""

from __future__ import annotations

import pytest
import yaml
from analyst_helpers import EpisodeBuilder, labels_answer, small_episodes
from trace_testing import TAU2_DIR, TAU2_FILES, run_cli, snapshot, write_jsonl

from trace_cli.analysts.base import PRESENT, Candidate
from trace_cli.analysts.hf import HFAnalyst
from trace_cli.errors import CheckFailed, UsageError
from trace_cli.stages.base import execute
from trace_cli.store import Store

CAPS = [
    Candidate("precondition_verification", "Reading an object before changing it. Needed for any write."),
    Candidate("tone_and_empathy", "Courteous phrasing. Needed whenever the agent writes to the user."),
]
LLM = {"model": "store://model/tiny", "max_tokens": 32, "max_retries": 1, "temperature": 1.0}


@pytest.fixture(scope="module")
def hf_store(tmp_path_factory):
    """A store with the tiny model (`tiny`) and 8 short episodes (`eps`: 4 failed, 4 passed)."""
    tmp = tmp_path_factory.mktemp("hf")
    store = Store(tmp / "store")
    execute("model", {"preset": "tiny", "corpus_seeds": 20}, store, name="tiny")
    recs = []
    for e in small_episodes(4, 4):
        b = EpisodeBuilder(
            e["episode_id"], success=e["success"], task_id=e["task_id"], reference=e["reference_actions"]
        )
        b.messages = e["messages"]
        recs.append(b.record())
    execute(
        "ingest", {"format": "jsonl", "path": str(write_jsonl(tmp / "eps.jsonl", recs))}, store, name="eps"
    )
    return store


def test_tiny_model_garbage_is_error_labels_and_fails_the_run(hf_store, tmp_path):
    recipe = {
        "kind": "recipe",
        "version": 1,
        "name": "hf-diagnose",
        "steps": [
            {
                "id": "diag",
                "uses": "diagnose",
                "name": "hf-diag",
                "with": {
                    "rollouts": "store://rollouts/eps",
                    "analyst": "hf",
                    "runs": 2,
                    "min_runs": 1,
                    "max_episodes": 6,
                    "llm": LLM,
                },
            }
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r = run_cli("run", path, "--store", hf_store.root)
    # a tiny untrained model answers garbage: every label is ERROR after the retries, and a diagnosis with
    # more than half ERROR labels fails its check (exit 1) instead of storing noise (issue 12)
    assert r.exit_code == 1, r.output
    assert "labels are ERROR" in r.output and "no diagnosis stored" in r.output
    assert not list((hf_store.root / "diagnosis").glob("*/manifest.yaml"))


def test_valid_answers_are_parsed_and_cached(hf_store, monkeypatch):
    prompts_seen = []

    def fake_generate(self, prompts, seed):
        prompts_seen.extend(prompts)
        return [labels_answer({"messages": p}) for p in prompts]

    monkeypatch.setattr(HFAnalyst, "_generate", fake_generate)
    eps = small_episodes(2, 1)
    a = HFAnalyst({"llm": LLM}, hf_store)
    labels = a.label(eps, CAPS, run=0, seed=3)
    assert [(lb.episode_id, lb.label) for lb in labels[::2]] == [
        ("e0", PRESENT),
        ("e1", PRESENT),
        ("e2", PRESENT),
    ]
    assert len(prompts_seen) == 3
    assert len(list((hf_store.root / "cache" / "hf").glob("*.json"))) >= 3
    HFAnalyst({"llm": LLM}, hf_store).label(eps, CAPS, run=0, seed=3)
    assert len(prompts_seen) == 3  # all from the cache
    HFAnalyst({"llm": LLM}, hf_store).label(eps, CAPS, run=1, seed=4)
    assert len(prompts_seen) == 6  # another run: new requests


def test_prompts_are_cut_to_the_context(hf_store):
    a = HFAnalyst({"llm": {**LLM, "max_tokens": 100_000}}, hf_store)
    model, tok = a._load()
    budget, new = a._budget(model)
    ctx = model.config.max_position_embeddings
    assert budget + new <= ctx and new < ctx and budget >= 1
    long = [{"role": "system", "content": "s"}, {"role": "user", "content": "word " * 20_000}]
    ids = a._prompt_ids(tok, long, 300)
    assert len(ids) == 300
    full = a._prompt_ids(tok, long, 10**9)
    assert ids[-10:] == full[-10:]  # the answer cue at the end is kept


def test_garbage_discovery_is_a_usage_error_and_writes_nothing(hf_store):
    before = [x for x in snapshot(hf_store.root) if not x[0].startswith(("cache", "index"))]
    with pytest.raises(UsageError, match="discovery failed"):
        execute(
            "diagnose",
            {
                "rollouts": "store://rollouts/eps",
                "analyst": "hf",
                "candidates": "discover",
                "runs": 1,
                "min_runs": 1,
                "llm": {**LLM, "max_tokens": 16},
            },
            hf_store,
        )
    after = [x for x in snapshot(hf_store.root) if not x[0].startswith(("cache", "index"))]
    assert after == before


def test_unknown_model_is_a_usage_error(hf_store):
    r = run_cli(
        "diagnose",
        "--rollouts",
        "store://rollouts/eps",
        "--analyst",
        "hf",
        "--llm-model",
        "store://model/nope",
        "--store",
        hf_store.root,
    )
    assert r.exit_code == 2, r.output


@pytest.mark.slow
def test_tiny_model_on_tau2_retail(hf_store):
    execute(
        "ingest", {"format": "tau2", "path": str(TAU2_DIR / TAU2_FILES["retail"])}, hf_store, name="retail"
    )
    # real τ²-bench transcripts through the hf analyst end to end: the untrained tiny model answers garbage,
    # so more than half the labels are ERROR and the run fails its check (exit 1) with nothing stored
    with pytest.raises(CheckFailed, match=r"labels are ERROR") as e:
        execute(
            "diagnose",
            {
                "rollouts": "store://rollouts/retail",
                "analyst": "hf",
                "runs": 2,
                "min_runs": 1,
                "max_episodes": 6,
                "llm": {**LLM, "max_tokens": 64},
            },
            hf_store,
        )
    assert e.value.exit_code == 1
    assert hf_store.list("diagnosis") == []
