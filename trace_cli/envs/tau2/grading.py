"""τ²-bench's reward for an episode, from τ²'s own component evaluators, and the agent's prompts.

`grade` follows τ²'s `evaluate_simulation` (evaluation type "all"), without the registry that would import
litellm: the termination gate (only a user or agent stop is scored), then each component the task's
`reward_basis` names — DB and ENV_ASSERTION (`EnvironmentEvaluator`: the agent's calls replayed on a fresh
environment, its DB hash against the gold actions' one), ACTION (`ActionEvaluator`), COMMUNICATE
(`CommunicateEvaluator`), NL_ASSERTION (τ²'s judge prompt, on the configured `judge_model` endpoint) — multiplied.
The environments come from the domain's cached pristine DB (`Domain.constructor`), not re-read from disk.
"""

from __future__ import annotations

import json
from typing import Any

from trace_cli.envs.base import RewardBreakdown
from trace_cli.envs.tau2.package import Domain, source_constant, tau2
from trace_cli.errors import UsageError

DONE = "done"  # LLMSoloAgent's stop tool
SCORED = ("user_stop", "agent_stop")


AGENT_MODULE = (
    "tau2.agent.llm_agent"  # imports litellm: its prompts are read from its source (`source_constant`)
)
STOP_TOKEN = "###STOP###"  # LLMSoloAgent.STOP_TOKEN


def agent_system_prompt(dom: Domain) -> str:
    """τ²'s `LLMAgent.system_prompt`: its instruction and the domain policy."""
    return source_constant(AGENT_MODULE, "SYSTEM_PROMPT").format(
        domain_policy=dom.policy, agent_instruction=source_constant(AGENT_MODULE, "AGENT_INSTRUCTION")
    )


def solo_system_prompt(dom: Domain, task: Any) -> str:
    """τ²'s `LLMSoloAgent.system_prompt`: its solo instruction, the domain's solo policy and the ticket."""
    instruction = source_constant(AGENT_MODULE, "AGENT_SOLO_INSTRUCTION").format(
        stop_function_name=DONE, stop_token=STOP_TOKEN
    )
    return source_constant(AGENT_MODULE, "SYSTEM_PROMPT_SOLO").format(
        agent_instruction=instruction, domain_policy=dom.solo_policy or dom.policy, ticket=task.ticket
    )


def done_tool_schema() -> dict[str, Any]:
    """τ²'s `done` tool (LLMSoloAgent.add_stop_tool), as τ²'s own `as_tool` renders it."""
    tau2()
    from tau2.environment.tool import as_tool

    def done() -> str:
        """Call this function when you are done with the task."""
        return STOP_TOKEN

    return as_tool(done).openai_schema


def _bases(task: Any) -> set[str]:
    crit = task.evaluation_criteria
    if crit is None:
        return set()
    return {str(getattr(b, "value", b)) for b in crit.reward_basis}


def check_bases(env_name: str, tasks: list[Any], judge: Any) -> None:
    """An NL-assertion reward basis needs a judge: refused up front, naming the tasks, never dropped."""
    needs = [t.id for t in tasks if "NL_ASSERTION" in _bases(t)]
    if needs and judge is None:
        raise UsageError(
            f"{env_name}: {len(needs)} task(s) score natural-language assertions with an LLM judge "
            f"(e.g. {', '.join(needs[:3])}); pass judge_model=openai:URL?model=NAME, or choose a split without them"
        )


JUDGE_SYSTEM = """
        TASK
        - You will be given a list of expected outcomes and a conversation that was collected during a test case run.
        - The conversation is between an agent and a customer.
        - Your job is to evaluate whether the agent satisfies each of the expected outcomes.
        - Grade each expected outcome individually.

        FORMAT
        - Your response should be a JSON object with the following fields:
        - `reasoning`: a short explanation for your classification
        - `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
        - `expectedOutcome`: repeat the expectation from the input that you are grading
<BLANK>
        Example response structure:
        {
            "results": [
                {
                    "expectedOutcome": "<one of the expected outcomes from the input>",
                    "reasoning": "<reasoning trace>",
                    "metExpectation": <false or true>,
                }
            ]
        }
        """.replace(
    "<BLANK>", " " * 8
)  # τ²'s NLAssertionsEvaluator prompt, verbatim (its module imports litellm)


def _nl_assertions(task: Any, messages: list[Any], judge: Any) -> tuple[float, list[dict[str, Any]]]:
    from trace_cli.llm.openai_client import MalformedReply, Unavailable

    assertions = list(task.evaluation_criteria.nl_assertions or [])
    if not assertions:
        return 1.0, []
    conversation = "\n".join(f"{m.role}: {m.content}" for m in messages)
    user = f"""
        conversation:
        {conversation}
<BLANK>
        expectedOutcomes:
        {assertions}
        """.replace("<BLANK>", " " * 8)
    try:
        data = json.loads(
            judge.complete(
                [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]
            ).text()
        )
        checks = [
            {
                "nl_assertion": r["expectedOutcome"],
                "met": bool(r["metExpectation"]),
                "justification": r["reasoning"],
            }
            for r in data.get("results", [])
        ]
    except (Unavailable, MalformedReply, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"the NL-assertion judge {judge.ep.display} failed: {e}") from None
    return (1.0 if checks and all(c["met"] for c in checks) else 0.0), checks


def grade(
    dom: Domain,
    task: Any,
    messages: list[Any],
    termination: str | None,
    *,
    solo: bool = False,
    judge: Any = None,
) -> RewardBreakdown:
    """τ²'s reward of `messages` (τ²'s message objects, the greeting first) for `task`."""
    if termination not in SCORED:
        return RewardBreakdown(
            0.0,
            False,
            {},
            {"termination": termination, "note": "not scored: τ² scores only a user or agent stop"},
        )
    tau2()
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    if task.evaluation_criteria is None:
        return RewardBreakdown(1.0, True, {}, {"termination": termination, "note": "no evaluation criteria"})
    bases = _bases(task)
    components: dict[str, float] = {}
    details: dict[str, Any] = {"termination": termination, "reward_basis": sorted(bases)}
    if bases & {"DB", "ENV_ASSERTION"}:
        info = EnvironmentEvaluator.calculate_reward(
            environment_constructor=dom.constructor(), task=task, full_trajectory=messages, solo_mode=solo
        )
        for key, value in (info.reward_breakdown or {}).items():
            components[str(getattr(key, "value", key))] = float(value)
        if info.db_check is not None:
            details["db_match"] = info.db_check.db_match
        if info.env_assertions:
            details["env_assertions"] = [bool(c.met) for c in info.env_assertions]
    if "ACTION" in bases:
        info = ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
        components["ACTION"] = float(info.reward)
        details["action_checks"] = [bool(c.action_match) for c in info.action_checks or []]
    if "COMMUNICATE" in bases:
        info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
        components["COMMUNICATE"] = float(info.reward)
        details["communicate_checks"] = [
            {"info": c.info, "met": bool(c.met)} for c in info.communicate_checks or []
        ]
    if "NL_ASSERTION" in bases:
        if judge is None:
            raise UsageError(f"task {task.id} scores NL assertions and no judge_model is configured")
        components["NL_ASSERTION"], details["nl_assertions"] = _nl_assertions(task, messages, judge)
    reward = 1.0
    for value in components.values():
        reward *= value
    return RewardBreakdown(reward, reward == 1.0, components, details)
