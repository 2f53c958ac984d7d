"""`trace eval`: rollouts + eval artifacts, pass@1 / pass^k (τ²-bench), per-family breakdown, bad inputs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tinymodel  # noqa: E402
from trace_testing import run_cli, snapshot  # noqa: E402

from trace_cli.envs.shop import CAPABILITIES, FAMILIES  # noqa: E402
from trace_cli.stages.eval import summarize  # noqa: E402
from trace_cli.store import Store  # noqa: E402
from trace_cli.store.metrics import pass_hat_k  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


def _eval(root: Path, *args: str) -> dict:
    r = run_cli("eval", *args, "--store", root, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _sql(root: Path, query: str) -> list[dict]:
    r = run_cli("store", "sql", query, "--store", root, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("eval-ref") / "store"
    return root, _eval(root, "--model", "policy:reference", "--env", "shop", "--seeds", "0:30")


# ------------------------------------------------------------------------------------------ built-in policies
def test_reference_policy_succeeds_everywhere(reference_store):
    root, doc = reference_store
    s = doc["summary"]
    assert s["tasks"] == s["episodes"] == 30
    assert s["mean_reward"] == s["pass@1"] == s["pass^k"]["1"] == 1.0
    assert set(s["families"]) == set(FAMILIES)
    assert all(f["pass@1"] == 1.0 and f["tasks"] == 5 for f in s["families"].values())
    (row,) = _sql(root, "select avg(success::int) as s, count(*) as n from episodes")
    assert row == {"s": 1.0, "n": 30}


def test_random_policy_nearly_always_fails(tmp_path):
    root = tmp_path / "store"
    s = _eval(root, "--model", "policy:random", "--env", "shop", "--seeds", "0:30")["summary"]
    assert s["pass@1"] <= 0.05 and s["mean_reward"] <= 0.05
    (row,) = _sql(root, "select avg(success::int) as s, sum(n_tool_calls) as calls from episodes")
    assert row["s"] <= 0.05 and row["calls"] > 0  # it did act


def test_eval_writes_rollouts_and_eval_artifacts(reference_store):
    root, doc = reference_store
    store = Store(root)
    ev = store.resolve(doc["eval"])
    ro = store.resolve(doc["rollouts"])
    assert (ev.kind, ro.kind) == ("eval", "rollouts") and ev.id == ro.id
    assert ev.summary["rollouts"] == ro.uri
    assert ro.summary["episodes"] == 30 and ro.summary["successes"] == 30
    for f in ("episodes.parquet", "tool_calls.parquet"):
        assert (ro.path / f).is_file()
    for f in ("eval_results.parquet", "task_metadata.parquet"):
        assert (ev.path / f).is_file()
    cfg = ev.config  # sampling settings are recorded
    assert (cfg["temperature"], cfg["top_p"], cfg["seed"], cfg["trials"]) == (0.0, 1.0, 0, 1)
    # same evaluation again: up to date, nothing rerun; the table has a row per family plus ALL
    before = snapshot(root)
    r = run_cli("eval", "--model", "policy:reference", "--env", "shop", "--seeds", "0:30", "--store", root)
    assert r.exit_code == 0, r.output
    assert "up to date" in r.stderr
    assert all(f in r.stdout for f in FAMILIES) and "ALL" in r.stdout
    assert [p for p, *_ in snapshot(root)] == [p for p, *_ in before]


def test_eval_views_are_queryable(reference_store):
    root, _ = reference_store
    rows = _sql(
        root, "select task_id, task_family, trials, successes, pass_hat_k from eval_results order by seed"
    )
    assert len(rows) == 30 and all(r["trials"] == 1 and r["successes"] == 1 for r in rows)
    assert json.loads(rows[0]["pass_hat_k"]) == {"1": 1.0}
    meta = _sql(
        root,
        "select t.task_family, t.required_capabilities, e.success from task_metadata t "
        "join episodes e using (task_id) order by t.seed",
    )
    assert len(meta) == 30
    caps = {m["task_family"]: json.loads(m["required_capabilities"]) for m in meta}
    assert caps["cancel_order"] == ["precondition_verification"] and caps["order_status"] == []
    assert all(c in CAPABILITIES for cs in caps.values() for c in cs)
    calls = _sql(root, "select count(*) as n, sum(error::int) as errors from tool_calls")
    assert calls[0]["n"] > 30 and calls[0]["errors"] == 0


def test_hidden_metadata_is_not_in_the_episodes_table(reference_store):
    root, _ = reference_store
    cols = {r["column_name"] for r in _sql(root, "describe episodes")}
    assert "required_capabilities" not in cols and "task_family" in cols
    rows = _sql(root, "select * from episodes")
    text = json.dumps(rows)
    for cap in CAPABILITIES:
        assert cap not in text, cap  # not in messages, tools, info, reference actions...
    text = json.dumps(_sql(root, "select * from tool_calls"))
    assert not any(cap in text for cap in CAPABILITIES)


# --------------------------------------------------------------------------------------------------- pass^k
def test_pass_hat_k_formula():
    # τ²-bench: pass^k of a task with c successes in n trials = C(c, k) / C(n, k)
    assert [pass_hat_k(2, 3, k) for k in (1, 2, 3)] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert [pass_hat_k(3, 3, k) for k in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert [pass_hat_k(0, 4, k) for k in (1, 2, 3, 4)] == [0.0] * 4
    assert pass_hat_k(3, 4, 2) == pytest.approx(3 / 6)
    with pytest.raises(ValueError):
        pass_hat_k(1, 2, 3)  # k > n: undefined (summaries never ask: k stops at the smallest n)


def test_uneven_trials_lower_max_k_never_nan():
    from trace_cli.store.metrics import summarize as pass_summary

    rows = [{"task_id": "a", "success": True, "reward": 1.0, "domain": "d"} for _ in range(3)]
    rows += [{"task_id": "b", "success": s, "reward": float(s), "domain": "d"} for s in (True, False)]
    summary, per_task = pass_summary(rows, "domain")
    assert set(summary["pass^k"]) == {"1", "2"}  # k <= min(3, 2)
    assert summary["pass^k"]["1"] == pytest.approx((1.0 + 0.5) / 2)
    assert summary["pass^k"]["2"] == pytest.approx((1.0 + 0.0) / 2)
    assert summary["groups"]["d"]["pass@1"] == pytest.approx(0.75)
    assert all(not math.isnan(v) for t in per_task for v in t["pass_hat_k"].values())


def test_summarize_hand_made_example():
    def ep(task, fam, ok):
        return {
            "task_id": task,
            "task_family": fam,
            "seed": int(task[1:]),
            "success": ok,
            "reward": float(ok),
        }

    rows = (
        [ep("t1", "a", True), ep("t1", "a", False), ep("t1", "a", True)]  # c=2 of n=3
        + [ep("t2", "a", True)] * 3  # 3 of 3
        + [ep("t3", "b", False)] * 3
    )  # 0 of 3
    summary, per_task = summarize(rows, 3)
    assert summary["tasks"] == 3 and summary["episodes"] == 9
    assert summary["pass@1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert summary["mean_reward"] == pytest.approx(5 / 9)
    assert summary["pass^k"] == pytest.approx({"1": (2 / 3 + 1) / 3, "2": (1 / 3 + 1) / 3, "3": 1 / 3})
    assert summary["families"]["a"]["pass^k"] == pytest.approx({"1": 5 / 6, "2": 2 / 3, "3": 0.5})
    assert summary["families"]["b"]["pass^k"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    t1 = next(t for t in per_task if t["task_id"] == "t1")
    assert (t1["trials"], t1["successes"]) == (3, 2)


def test_trials_with_sampling_on_the_tiny_model(tiny_model, tmp_path):
    root = tmp_path / "store"
    doc = _eval(
        root,
        "--model",
        str(tiny_model.hf),
        "--env",
        "shop",
        "--seeds",
        "0:2",
        "--trials",
        "3",
        "--temperature",
        "1.0",
        "--max-new-tokens",
        "8",
        "--max-turns",
        "2",
        "--batch-size",
        "6",
    )
    s = doc["summary"]
    assert s["tasks"] == 2 and s["episodes"] == 6
    # an untrained model never stops: every turn hits max_new_tokens, and the summary says so (issue 12)
    assert s["truncated_turns"] > 0 and "hit max_new_tokens (8)" in s["warnings"][0]
    assert set(s["pass^k"]) == {"1", "2", "3"}
    assert all(set(f["pass^k"]) == {"1", "2", "3"} for f in s["families"].values())
    per_seed = _sql(
        root,
        "select seed, count(*) as n, list(trial order by trial) as trials "
        "from episodes group by seed order by seed",
    )
    assert per_seed == [{"seed": 0, "n": 3, "trials": [0, 1, 2]}, {"seed": 1, "n": 3, "trials": [0, 1, 2]}]
    res = _sql(root, "select trials, pass_hat_k from eval_results")
    assert all(r["trials"] == 3 and set(json.loads(r["pass_hat_k"])) == {"1", "2", "3"} for r in res)
    info = [json.loads(r["info"]) for r in _sql(root, "select info from episodes")]
    assert all(i["gen_tokens"] > 0 for i in info)
    ev = Store(root).resolve(doc["eval"])
    assert ev.config["temperature"] == 1.0 and ev.config["trials"] == 3
    assert any(i.get("role") == "model" and i.get("path") for i in ev.manifest["inputs"])


# ----------------------------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def no_tokenizer_dir(tiny_model, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("notok") / "model"
    shutil.copytree(tiny_model.hf, d)
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            f.unlink()
    assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
    return d


BAD = [
    (["--env", "nope"], "unknown environment 'nope'"),
    (["--seeds", "10:5"], "10:5"),
    (["--seeds", "abc"], "not a range"),
    (["--seeds", "-1:3"], "empty or negative"),
    (["--env", "shop?n_orders=abc"], "n_orders"),
    (["--env", "shop?nope=1"], "unknown parameter 'nope'"),
    (["--env", "shop?families=nope"], "unknown task family"),
    (["--model", "policy:nope"], "unknown built-in policy"),
    (["--model", "Qwen/Qwen3-8B"], "offline"),
    (["--model", "store://model/missing"], "missing"),
    (["--model", "NOTOK"], "no tokenizer"),
    (["--trials", "0"], "trials"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exit_2_and_nothing_written(reference_store, no_tokenizer_dir, args, message):
    root, _ = reference_store
    args = [str(no_tokenizer_dir) if a == "NOTOK" else a for a in args]
    base = {"--model": "policy:reference", "--env": "shop", "--seeds": "0:3"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    before = snapshot(root)
    r = run_cli("eval", *[x for kv in base.items() for x in kv], "--store", root, env={"HF_HUB_OFFLINE": "1"})
    assert r.exit_code == 2, r.output
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.output
    assert snapshot(root) == before
    if "Qwen" in " ".join(args):
        assert "cache" in r.stderr  # says why: not in the local cache, and no download offline


def test_prompt_longer_than_the_context_is_exit_2(tiny_model, reference_store):
    """The first prompt + one turn must fit the model's context (checked before any generation)."""
    root, _ = reference_store
    before = snapshot(root)
    r = run_cli(
        "eval",
        "--model",
        str(tiny_model.hf),
        "--env",
        "shop",
        "--seeds",
        "0:1",
        "--max-new-tokens",
        "5000",
        "--store",
        root,
    )
    assert r.exit_code == 2 and "more than the model's context (4096)" in r.stderr, r.output
    assert snapshot(root) == before
