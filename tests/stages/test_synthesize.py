"""Stage `synthesize` and `trace synthesize`: gating checks, calibration (fail with numbers / pass), the
environment artifact (schema, calibration view, samples), loading it back (`trace eval --env store://...`),
targets recovered from τ² rollouts, LLM-authored modules through a fake OpenAI server, a tiny HF policy."""

from __future__ import annotations

import contextlib
import json
import random

import pyarrow.parquet as pq
import pytest
import yaml
from serving import chat_server  # noqa: E402
from trace_testing import TAU2_FILES, make_diagnosis, run_cli

import trace_cli.stages.synthesize as synth
from trace_cli.config.schemas import validate
from trace_cli.envs.artifact import read_environment
from trace_cli.envs.registry import make_env
from trace_cli.envs.shop import TOOL_SCHEMAS
from trace_cli.errors import CheckFailed, UsageError
from trace_cli.stages.base import execute
from trace_cli.store import Store

CAPS = [
    "precondition_verification",
    "structured_data_reasoning",
    "multi_step_completion",
    "tool_calling_precision",
]
SMALL = {"seeds": 12, "rollouts": 8, "batch_size": 48}


class MixPolicy:
    """Follows the reference on a seeded 40 % of episodes, else says goodbye: in band by construction."""

    name = "mix"

    def __init__(self, p=0.4, seed=0):
        self.p, self.seed = p, seed

    def begin(self, state):
        rng = random.Random(f"{self.seed}:{state.seed}:{state.trial}")
        state.turns.append({"plan": list(state.env.reference_actions()) if rng.random() < self.p else []})

    def act(self, states):
        return [
            [s.turns[0]["plan"].pop(0)] if s.turns[0]["plan"] else [{"content": "Goodbye."}] for s in states
        ]


@pytest.fixture
def st(tmp_path):
    return Store(tmp_path / "store")


@pytest.fixture
def in_band(monkeypatch):
    monkeypatch.setattr(
        synth, "load_calibration_policy", lambda model, store, cfg: MixPolicy(seed=cfg["seed"])
    )


def synth_cli(root, diag, *args, capability=None, model="policy:random"):
    """`trace synthesize` of a diagnosis (one capability, or every selected one) with the random policy."""
    cap = ("--capability", capability) if capability else ()
    return run_cli("synthesize", "--diagnosis", diag, *cap, "--model", model, *args, "--store", root)


def reference_pass_at_1(st, env: str, seeds: str) -> float:
    """pass@1 of the reference policy on `env` (`trace eval --json`)."""
    r = run_cli(
        "eval", "--env", env, "--model", "policy:reference", "--seeds", seeds, "--json", "--store", st.root
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["summary"]["pass@1"]


def synthesize_authored(st, diag, capability, llm, *, author="openai", name=None, **config):
    """Stage synthesize of one capability by an LLM author (`llm`: its settings), calibrated on SMALL."""
    return synthesize_one(
        st, diag, capability, author=author, calibration=SMALL, llm=llm, name=name, **config
    )


def synthesize_one(store, diag, capability, *, name=None, **config):
    """Stage synthesize of one capability with the random policy; `config` over that."""
    config = {"diagnosis": diag, "capability": capability, "model": "policy:random", **config}
    return execute("synthesize", config, store, name=name)


def test_reference_policy_is_too_good_exit_1_with_numbers(st):
    diag = make_diagnosis(st, CAPS)
    r = synth_cli(
        st.root,
        diag,
        "--calibration-seeds",
        "6",
        "--calibration-rollouts",
        "2",
        capability="precondition_verification",
        model="policy:reference",
    )
    assert r.exit_code == 1, r.output
    assert "success 1.000" in r.output and "all-1 groups 1.00" in r.output
    assert "-> harder" in r.output and ("hardest" in r.output or "no attempts left" in r.output)
    assert "calibration" in r.stdout and "determinism" in r.stdout  # tables of checks and attempts
    assert not st.list("environment")  # nothing admitted


def test_calibration_failure_raises_checkfailed_with_attempts(st):
    diag = make_diagnosis(st, CAPS)
    with pytest.raises(CheckFailed) as e:
        synthesize_one(
            st, diag, "multi_step_completion", calibration={"seeds": 5, "rollouts": 2, "max_attempts": 2}
        )
    d = e.value.details
    assert len(d["attempts"]) == 2 and all(a["mean_success"] == 0.0 for a in d["attempts"])
    # too hard: hints first (the level is kept), recorded in the artifact's attempts
    assert "attempt 1 (level 4" in e.value.message and "attempt 2 (level 4, hints 0.50" in e.value.message
    assert [a["hint_share"] for a in d["attempts"]] == [0.0, 0.5]  # 1 of 2 rollouts: share 0.25 rounded
    assert d["attempts"][1]["params"]["hint_share"] == 0.25
    assert all(a["frac_constant_low"] == 1.0 for a in d["attempts"])
    assert e.value.exit_code == 1
    # charged what ran (the sequential test may stop an attempt early), and remembered: the same config fails
    # again at once with the same numbers, and --force runs it again
    ran = sum(a["seeds"] * a["rollouts"] for a in d["attempts"])
    assert d["rollouts_run"] == ran and f"({ran} rollouts)" in e.value.message
    cfg = {
        "diagnosis": diag,
        "capability": "multi_step_completion",
        "model": "policy:random",
        "calibration": {"seeds": 5, "rollouts": 2, "max_attempts": 2},
    }
    with pytest.raises(CheckFailed) as again:
        execute("synthesize", cfg, st)
    assert again.value.details["cached"] and again.value.details["rollouts_run"] == ran
    assert "cached failure" in again.value.message and "attempt 2 (level 4, hints" in again.value.message
    with pytest.raises(CheckFailed) as forced:
        execute("synthesize", cfg, st, force=True)
    assert "cached" not in forced.value.details


def test_capability_must_be_selected_and_have_a_template(st):
    diag = make_diagnosis(st, selected=["precondition_verification", "tone_and_empathy"])
    r = synth_cli(st.root, diag, capability="multi_step_completion")
    assert r.exit_code == 2 and "selected: precondition_verification, tone_and_empathy" in r.output
    with pytest.raises(UsageError, match="no environment template"):
        synthesize_one(st, diag, "tone_and_empathy")
    with pytest.raises(UsageError, match="unknown parameter 'bogus'"):
        synthesize_one(st, diag, "precondition_verification", params={"bogus": 1})
    with pytest.raises(UsageError, match="overlaps"):
        synthesize_one(st, diag, "precondition_verification", seeds={"train": "0:100", "eval": "50:60"})
    with pytest.raises(UsageError, match="llm.base_url"):
        synthesize_one(st, diag, "precondition_verification", author="openai")


def test_every_selected_capability_gets_an_artifact_that_eval_loads(st, in_band):
    diag = make_diagnosis(st, CAPS)
    r = synth_cli(
        st.root, diag, "--calibration-seeds", "12", "--calibration-rollouts", "8", "--name", "demo", "--json"
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [e["capability"] for e in out["environments"]] == CAPS and not out["failures"]
    for e in out["environments"]:
        assert e["name"] == f"demo-{e['capability']}"
        att = e["calibration"]["attempts"]
        assert len(att) == 1 and att[0]["in_band"] and 0.2 <= att[0]["mean_success"] <= 0.6
        assert all(c["passed"] for c in e["checks"].values()) and e["checks"]["reference"]["seeds"] >= 100
    art = st.resolve("store://environment/demo-precondition_verification")
    doc = yaml.safe_load((art.path / "environment.yaml").read_text())
    validate(doc, "environment.v1.json")
    assert doc["source"] == "template" and doc["template"] == "precondition_verification"
    assert doc["seeds"] == {"train": "0:100000", "eval": "1000000:1000200"}
    assert doc["params"]["level"] == 2 and "forbidden_fraction" in doc["params"]
    assert all(t == TOOL_SCHEMAS[t["function"]["name"]] for t in doc["tools"])
    assert doc["target"]["kind"] == "env" and doc["target"]["missing"] == []
    rows = pq.read_table(art.path / "calibration.parquet").to_pylist()
    assert rows[0]["attempt"] == 1 and rows[0]["in_band"] and json.loads(rows[0]["params"])["level"] == 2
    samples = [json.loads(x) for x in (art.path / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["success"] for s in samples} == {True, False}
    r = run_cli(
        "store",
        "sql",
        "SELECT count(*) AS n, min(mean_success) AS lo FROM calibration",
        "--json",
        "--store",
        st.root,
    )
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["n"] == 4
    # loadable through the registry hook, by URI and by name, and by `trace eval`
    env = make_env("store://environment/demo-tool_calling_precision", store=st)
    assert (
        env.params
        == yaml.safe_load(
            (st.resolve("environment/demo-tool_calling_precision").path / "environment.yaml").read_text()
        )["params"]
    )
    assert make_env("demo-multi_step_completion", store=st).name == "synthetic-multi_step_completion"
    assert (
        reference_pass_at_1(st, "store://environment/demo-structured_data_reasoning", "1000000:1000020")
        == 1.0
    )
    # same inputs => same artifact, skipped
    r = synth_cli(
        st.root,
        diag,
        "--calibration-seeds",
        "12",
        "--calibration-rollouts",
        "8",
        "--name",
        "demo",
        capability="multi_step_completion",
    )
    assert r.exit_code == 0 and "up to date" in r.output


def test_calibration_adjusts_difficulty_then_passes(st, monkeypatch):
    class LevelPolicy(MixPolicy):
        def begin(self, state):
            self.p = {2: 0.95, 3: 0.4}.get(state.env.level, 0.0)
            super().begin(state)

    monkeypatch.setattr(synth, "load_calibration_policy", lambda model, store, cfg: LevelPolicy())
    diag = make_diagnosis(st, CAPS)
    art = synthesize_one(st, diag, "tool_calling_precision", calibration=SMALL, name="tcp").main
    doc = read_environment(art)
    att = doc["calibration"]["attempts"]
    assert [a["params"]["level"] for a in att] == [2, 3] and att[0]["next"] == "harder" and att[1]["in_band"]
    assert doc["params"]["level"] == 3 and art.summary["calibration_attempts"] == 2
    # the admitted attempt's hint share and reward-based constant-group share, in the summary and the document
    assert art.summary["hint_share"] == att[1]["hint_share"] == 0.0
    assert art.summary["frac_constant_low"] == att[1]["frac_constant_low"] <= 0.2


@pytest.fixture(scope="module")
def retail_store(tau2_dir, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("synth-tau2") / "store")
    execute(
        "ingest", {"format": "tau2", "path": str(tau2_dir / TAU2_FILES["retail"])}, store, name="tau2-retail"
    )
    return store


def test_target_from_tau2_rollouts_keeps_its_schemas(retail_store, in_band):
    from trace_cli.envs.synthetic import recover_tools

    st = retail_store
    diag = make_diagnosis(st, CAPS, name="diag-tau2", rollouts="store://rollouts/tau2-retail")
    recovered = recover_tools(st.resolve("rollouts/tau2-retail"))
    for cap in ("structured_data_reasoning", "precondition_verification"):
        art = synthesize_one(
            st, diag, cap, target="store://rollouts/tau2-retail", calibration=SMALL, name=f"tau2-{cap}"
        ).main
        doc = read_environment(art)
        assert doc["target"]["kind"] == "rollouts" and doc["target"]["artifact"].startswith(
            "store://rollouts/"
        )
        for t in doc["tools"]:
            n = t["function"]["name"]
            if n in recovered:
                assert doc["tool_sources"][n] == "target"
                assert t["function"]["parameters"] == recovered[n]["function"]["parameters"]
            else:
                assert doc["tool_sources"][n] == "shop_fallback" and n in doc["target"]["missing"]
        env = make_env(f"store://environment/tau2-{cap}", store=st)
        assert [t["function"]["parameters"] for t in env.reset(5).tools] == [
            t["function"]["parameters"] for t in doc["tools"]
        ]
    assert read_environment(st.resolve("environment/tau2-structured_data_reasoning"))["target"][
        "missing"
    ] == ["list_user_orders"]
    assert any(a.kind == "rollouts" for a in [st.resolve("rollouts/tau2-retail")])


def test_fan_out_names_each_capability_and_collects_failures(st, monkeypatch):
    """stages.base.execute_each: one run per listed capability, named NAME-CAPABILITY; one that fails
    calibration is reported and the others are kept; `failed` words the error the command exits 1 with."""
    from trace_cli.stages.base import execute_each, failed, fan_out

    monkeypatch.setattr(
        synth,
        "load_calibration_policy",
        lambda model, store, cfg: MixPolicy(p=0.4 if cfg["capability"] == CAPS[0] else 1.0),
    )
    diag = make_diagnosis(st, CAPS)
    cfg = {"diagnosis": diag, "model": "policy:random", "calibration": {**SMALL, "max_attempts": 1}}
    assert [k for k, _ in fan_out("synthesize", cfg, st)] == CAPS  # none given: every selected one
    assert fan_out("synthesize", {**cfg, "capability": CAPS[0]}, st) == [
        (None, {**cfg, "capability": CAPS[0]})
    ]
    members = list(execute_each("synthesize", {**cfg, "capability": CAPS[:2]}, st, name="x"))
    assert [(m.key, m.name) for m in members] == [(CAPS[0], f"x-{CAPS[0]}"), (CAPS[1], f"x-{CAPS[1]}")]
    assert members[0].outcome.main.uri == st.resolve(f"environment/x-{CAPS[0]}").uri
    assert members[1].outcome is None and "success 1.000" in members[1].failure.message
    err = failed("synthesize", members)
    assert err.exit_code == 1
    assert err.message == f"1 of 2 capabilities failed their checks or calibration: {CAPS[1]}"
    assert [n for k, n, _ in st.names() if k == "environment"] == [f"x-{CAPS[0]}"]
    # unnamed: the command names them CAPABILITY (key_names), a recipe step leaves them unnamed
    members = list(execute_each("synthesize", {**cfg, "capability": CAPS[:1]}, st, key_names=True))
    assert members[0].name == CAPS[0] and members[0].outcome.skipped


def test_fan_out_checks_every_capability_before_running_any(st, in_band):
    diag = make_diagnosis(st, selected=["precondition_verification", "tone_and_empathy"])
    r = synth_cli(st.root, diag)
    assert r.exit_code == 2 and "no environment template" in r.output
    assert st.list("environment") == []  # precondition_verification, which has one, did not run either
    empty = make_diagnosis(st, selected=[], name="none")
    r = synth_cli(st.root, empty)
    assert r.exit_code == 2 and "selects no capability; nothing to synthesize" in r.output
    with pytest.raises(UsageError, match="one capability"):  # the stage itself makes one environment a run
        execute("synthesize", {"diagnosis": diag, "model": "policy:random"}, st)


# ---------------------------------------------------------------------------------------------- LLM author

GOOD_MODULE = """
from trace_cli.envs.synthetic import TEMPLATES

def make_env(**params):
    return TEMPLATES["precondition_verification"](**params)
"""
SOCKET_MODULE = "import socket\n\ndef make_env(**params):\n    socket.socket()\n"
WRITE_MODULE = "def make_env(**params):\n    open('{path}', 'w').write('pwned')\n"
BROKEN_MODULE = "def make_env(**params):\n    raise ValueError('broken on purpose')\n"
LAZY_MODULE = GOOD_MODULE + (
    "\n_make = make_env\n\ndef make_env(**params):\n    env = _make(**params)\n"
    "    env.reference_actions = lambda: [{'content': 'Goodbye.'}]\n    return env\n"
)


class FakeLLM:
    """A chat-completions server answering each request with the next module in `modules`."""

    def __init__(self, modules):
        self.modules = list(modules)
        self.requests = []
        self._stack = contextlib.ExitStack()
        self.url = self._stack.enter_context(chat_server(self._answer))

    def _answer(self, body):
        self.requests.append(body)
        src = self.modules.pop(0) if self.modules else GOOD_MODULE
        return json.dumps({"module": src})

    def close(self):
        self._stack.close()


@pytest.mark.needs_sandbox
def test_llm_authored_module_rejections_kept_then_accepted(st, in_band):
    llm = FakeLLM([BROKEN_MODULE, LAZY_MODULE])
    try:
        diag = make_diagnosis(st, selected=["precondition_verification"])
        art = synthesize_authored(
            st,
            diag,
            "precondition_verification",
            {"base_url": llm.url, "model": "fake", "attempts": 3},
            sandbox={"cpu_s": 5, "timeout_s": 20, "memory_mb": 512},
            name="authored",
        ).main
    finally:
        llm.close()
    doc = read_environment(art)
    assert doc["source"] == "module" and doc["module"] == "module.py"
    mods = doc["authoring"]["modules"]
    assert [m["accepted"] for m in mods] == [False, False, True]
    # the pre-screen's capped counts are on record; the admitted module then passed the full checks
    assert doc["authoring"]["prescreen"] == {
        "reference_seeds": 100,
        "determinism_seeds": 10,
        "do_nothing_seeds": 50,
        "leakage_seeds": 50,
    }
    assert "ValueError" in mods[0]["reason"] and "broken on purpose" in mods[0]["reason"]
    assert mods[1]["reason"].startswith("check reference failed")
    assert (art.path / "modules" / "attempt-1.py").read_text() == BROKEN_MODULE  # rejected modules are kept
    assert "rejected" in llm.requests[1]["messages"][1]["content"]  # the next request is told why
    assert "precondition_verification" in llm.requests[0]["messages"][1]["content"]
    assert (
        "get_order_details" in llm.requests[0]["messages"][1]["content"]
    )  # target tool schemas in the prompt
    env = make_env("store://environment/authored", store=st)  # runs in the sandbox
    assert type(env).__name__ == "SandboxedEnv"
    assert reference_pass_at_1(st, "store://environment/authored", "1000000:1000008") == 1.0
    assert st.verify() == []


@pytest.mark.needs_sandbox
def test_llm_author_all_rejected_falls_back_to_template_or_fails(st, in_band, capfd):
    llm = FakeLLM([BROKEN_MODULE] * 6)
    try:
        diag = make_diagnosis(st, selected=["precondition_verification"])
        fake = {"base_url": llm.url, "model": "fake", "attempts": 2}
        art = synthesize_authored(st, diag, "precondition_verification", fake).main
        doc = read_environment(art)
        assert doc["source"] == "template" and doc["authoring"]["fallback"] == "template"
        assert [m["accepted"] for m in doc["authoring"]["modules"]] == [False, False]
        err = capfd.readouterr().err
        assert (
            "notice: every module the openai author wrote for precondition_verification was rejected" in err
        )
        assert "falling back to the built-in template of precondition_verification" in err
        with pytest.raises(CheckFailed, match="rejected .*strict: no fallback to the template"):
            synthesize_authored(st, diag, "precondition_verification", fake, strict=True)
        with pytest.raises(CheckFailed, match="rejected"):
            synthesize_authored(st, diag, "precondition_verification", {**fake, "fallback": "none"})
    finally:
        llm.close()


FRAME_WALK_MODULE = """import sys

def make_env(**params):
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, (set, list, dict)):
                v.clear()
        f = f.f_back
    try:
        open('{path}', 'w').write('pwned')
    except Exception:
        pass
    from trace_cli.envs.synthetic import TEMPLATES
    return TEMPLATES['precondition_verification'](**params)
"""
FORK_MODULE = "import os\n\ndef make_env(**params):\n    os.fork()\n"


@pytest.mark.needs_sandbox
def test_an_authored_module_that_tries_to_escape_fails_synthesize(st, in_band):
    """Through the real authoring path (an OpenAI-compatible server on loopback answering with escaping
    modules), every module is rejected and, without the template fallback, synthesize fails (exit 1)."""
    evil = st.root.parent / "evil.txt"
    diag = make_diagnosis(st, selected=["precondition_verification"])
    for seed, (first, why) in enumerate(
        (
            (FRAME_WALK_MODULE.format(path=evil), "writing outside the sandbox directory"),
            (FORK_MODULE, "starting processes"),
            (SOCKET_MODULE, "network access is not allowed"),
            (WRITE_MODULE.format(path=evil), "writing outside the sandbox directory"),
        )
    ):
        llm = FakeLLM([first, GOOD_MODULE])  # a good module would come next: it is never asked for
        try:
            with pytest.raises(CheckFailed, match="forbidden action") as e:
                execute(
                    "synthesize",
                    {
                        "diagnosis": diag,
                        "capability": "precondition_verification",
                        "model": "policy:random",
                        "author": "openai",
                        "calibration": SMALL,
                        "seed": seed,  # a new request each time (answers are cached per request)
                        "llm": {"base_url": llm.url, "model": "fake", "attempts": 3, "fallback": "template"},
                    },
                    st,
                )
        finally:
            llm.close()
        assert e.value.exit_code == 1 and why in e.value.message, e.value.message
        assert len(llm.requests) == 1  # no further attempt, no template fallback
        assert not evil.exists() and st.list("environment") == []


def _authored(st, in_band) -> object:
    llm = FakeLLM([GOOD_MODULE])
    try:
        diag = make_diagnosis(st, selected=["precondition_verification"])
        return synthesize_authored(
            st,
            diag,
            "precondition_verification",
            {"base_url": llm.url, "model": "fake", "attempts": 1},
            name="authored",
        ).main
    finally:
        llm.close()


@pytest.mark.needs_sandbox
def test_a_crafted_environment_artifact_cannot_point_outside_or_swap_its_module(st, in_band, tmp_path):
    import trace_cli.envs.loading as loading

    art = _authored(st, in_band)
    outside = tmp_path / "outside.py"
    outside.write_text(GOOD_MODULE)
    doc_path = art.path / "environment.yaml"
    doc = yaml.safe_load(doc_path.read_text())
    for module, why in (
        (str(outside), "not a file inside the artifact"),
        ("../../../outside.py", "not a file inside"),
    ):
        loading.MODULE_FACTORIES.clear()
        doc_path.write_text(yaml.safe_dump({**doc, "module": module}))
        with pytest.raises(UsageError, match=why):
            make_env("store://environment/authored", store=st)
    loading.MODULE_FACTORIES.clear()
    doc_path.write_text(yaml.safe_dump({**doc, "authoring": {**doc["authoring"], "sandbox": {"cpu_s": 1e9}}}))
    (art.path / doc["module"]).write_text(GOOD_MODULE + "\n# changed after commit\n")
    with pytest.raises(UsageError, match="does not match the hash"):
        make_env("store://environment/authored", store=st)


# ---------------------------------------------------------------------------------------------- real policy


def test_tiny_hf_model_calibration_path_runs(st):
    model = execute("model", {"preset": "tiny", "corpus_seeds": 20}, st, name="tiny").main
    diag = make_diagnosis(st, selected=["tool_calling_precision"])
    cfg = {
        "diagnosis": diag,
        "capability": "tool_calling_precision",
        "model": "store://model/tiny",
        "max_turns": 8,
        "calibration": {"seeds": 2, "rollouts": 2, "max_attempts": 2, "max_new_tokens": 12},
    }
    try:
        art = execute("synthesize", cfg, st).main
        attempts = read_environment(art)["calibration"]["attempts"]
    except CheckFailed as e:  # an untrained model is far below the band: the numbers come back
        attempts = e.details["attempts"]
        assert "attempt 1" in e.message
    assert 1 <= len(attempts) <= 2 and attempts[0]["seeds"] == 2 and attempts[0]["rollouts"] == 2
    assert model.kind == "model"


@pytest.mark.needs_sandbox
def test_hf_author_untrained_model_gives_no_module_and_falls_back(st, in_band):
    execute("model", {"preset": "tiny", "corpus_seeds": 20}, st, name="tiny")
    diag = make_diagnosis(st, selected=["multi_step_completion"])
    art = synthesize_authored(
        st,
        diag,
        "multi_step_completion",
        {"model": "store://model/tiny", "attempts": 1, "max_tokens": 24, "max_retries": 0},
        author="hf",
    ).main
    doc = read_environment(art)
    assert doc["source"] == "template" and doc["authoring"]["fallback"] == "template"
    assert doc["authoring"]["author"] == "hf" and not doc["authoring"]["modules"][0]["accepted"]
    assert doc["authoring"]["modules"][0]["reason"].startswith("no usable module")


def test_tools_needed_offers_only_the_templates_tools(st, in_band):
    """tools: needed keeps the template's own tool list and the target's hand-off to a human, last as in every
    target task (an agent that reads the list as a cue to the kind of task sees what the target shows for that
    kind); the default offers the target's whole action space."""
    from trace_cli.envs.synthetic import TEMPLATES

    diag = make_diagnosis(st, selected=["precondition_verification"])
    cfg = {"target": "shop", "calibration": SMALL}
    needed = synthesize_one(st, diag, "precondition_verification", **cfg, tools="needed", name="needed").main
    whole = synthesize_one(st, diag, "precondition_verification", **cfg, name="whole").main
    assert needed.id != whole.id
    names = {
        a.id: [
            t["function"]["name"] for t in yaml.safe_load((a.path / "environment.yaml").read_text())["tools"]
        ]
        for a in (needed, whole)
    }
    assert names[needed.id] == [*TEMPLATES["precondition_verification"].TOOLS, "transfer_to_human_agents"]
    assert names[whole.id][: len(names[needed.id]) - 1] == names[needed.id][:-1]
    assert "list_user_orders" in names[whole.id] and "list_user_orders" not in names[needed.id]
    obs = make_env("store://environment/needed", store=st).reset(1000000)
    assert [t["function"]["name"] for t in obs.tools] == names[needed.id]
    with pytest.raises(UsageError, match="needs author: template"):
        synthesize_one(
            st, diag, "precondition_verification", **cfg, tools="needed", author="hf", llm={"model": "x"}
        )


def test_calibration_rollouts_are_reused_as_the_first_grpo_steps(st):
    """A model calibrates with GRPO's own sampler; the admitted attempt's episodes are kept as token sequences and
    `train --set reuse_calibration=N` takes them as its first steps instead of generating new rollouts."""
    import pyarrow.parquet as pq

    from trace_cli.envs.artifact import read_calibration_rollouts

    execute("model", {"preset": "tiny", "corpus_seeds": 20}, st, name="tiny")
    diag = make_diagnosis(st, selected=["precondition_verification"])
    sampling = {"max_turns": 4}
    cal = {"seeds": 4, "rollouts": 4, "max_attempts": 1, "max_new_tokens": 12, "max_completion_length": 96}
    cal.update(band=[0.0, 1.0], max_group_all0=1.0, max_group_all1=1.0, look=0)  # an untrained model: in band
    env = execute(
        "synthesize",
        {
            "diagnosis": diag,
            "capability": "precondition_verification",
            "model": "store://model/tiny",
            **sampling,
            "calibration": cal,
        },
        st,
        name="env-tok",
    ).main
    meta = env.summary["calibration_rollouts"]
    assert meta["episodes"] == 16 and meta["seeds"] == 4 and meta["max_new_tokens"] == 12
    eps = read_calibration_rollouts(env)
    assert [e["seed"] for e in eps] == sorted(e["seed"] for e in eps) and len(eps) == 16
    assert all(len(e["completion_ids"]) == len(e["env_mask"]) and sum(e["env_mask"]) > 0 for e in eps)
    assert pq.read_table(env.path / "calibration_rollouts.parquet").num_rows == 16
    grpo = {
        "method": "grpo",
        "env": "store://environment/env-tok",
        "model": "store://model/tiny",
        "num_generations": 4,
        "per_device_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_steps": 3,
        "max_new_tokens": 12,
        "max_completion_length": 96,
        "checkpoint_every": 0,
        "learning_rate": 0.05,
        "lora": {"r": 4, "alpha": 8},
        "require_learning": False,
        "reuse_calibration": 5,
        **sampling,
    }
    art = execute("train", grpo, st).main
    # 16 episodes are two steps of 8; the third step generated its own
    assert art.summary["reused_calibration_steps"] == 2 and art.summary["reused_calibration_episodes"] == 16
    rows = pq.read_table(art.path / "train_metrics.parquet").to_pylist()
    turns = [r for r in rows if r.get("turns") is not None]
    for step, chunk in ((1, eps[:8]), (2, eps[8:])):  # each reused step saw exactly those episodes
        row = next(r for r in turns if r["step"] == step)
        assert row["turns"] == pytest.approx(sum(e["n_actions"] for e in chunk) / 8), (row, step)
    # other sampling settings than calibration's: nothing reused, and the run says why
    other = execute("train", {**grpo, "max_new_tokens": 16, "max_steps": 1}, st).main
    assert other.summary["reused_calibration_steps"] == 0


def test_the_task_mix_comes_from_the_diagnosis_lacking_conversations(st, in_band):
    """shop-mixed conversations of an agent lacking precondition verification (the environment's deficit
    demonstrations, 90 %), diagnosed by the rules analyst: the precondition environment's refusal share and
    returns come from the conversations labelled LACKING it (recorded as shaped_by, where calibration starts);
    shape_min_tasks 0 turns it off."""
    from trace_cli.compose.needs import diagnosed
    from trace_cli.envs.synthetic import TEMPLATES
    from trace_cli.envs.synthetic.shaping import profile

    cap = "precondition_verification"
    agent = f"policy:demonstration?deficits={cap}&rate=0.9"
    cfg = {"model": agent, "env": "shop-mixed", "seeds": "0:120"}
    ro = execute("eval", cfg, st).outputs["rollouts"]
    diag = execute("diagnose", {"rollouts": ro.uri, "analyst": "rules", "seed": 0}, st).main
    assert cap in diag.summary["selected"]
    lacking = [ep for ep, slot in diagnosed(diag, ro, [cap]) if slot]
    pins = TEMPLATES[cap].shape(profile(lacking))
    assert len(lacking) >= 5 and pins

    def doc_of(art):
        return yaml.safe_load((art.path / "environment.yaml").read_text())

    doc = doc_of(synthesize_one(st, diag.uri, cap, calibration=SMALL).main)
    validate(doc, "environment.v1.json")
    assert doc["shaped_by"]["lacking_conversations"] == len(lacking)
    assert doc["shaped_by"]["params"] == pins
    assert {k: doc["params"][k] for k in pins} == pins
    off = doc_of(synthesize_one(st, diag.uri, cap, calibration=SMALL, shape_min_tasks=0).main)
    assert "shaped_by" not in off
    level = TEMPLATES[cap].LEVELS[off["params"]["level"]]
    assert off["params"]["forbidden_fraction"] == level["forbidden_fraction"]
