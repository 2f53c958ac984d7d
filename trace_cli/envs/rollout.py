"""The agent rollout loop shared by `trace eval` and training: many episodes in flight at once.

Each round, every active episode asks the policy for its next assistant turn (an HF policy generates for
the whole batch in one `generate` call with left padding and KV cache). A policy answers with structured
turns (`Turn`: actions, and the text the transcript shows): parsing a model's text is the policy's business
(trace_cli.agents), so this loop knows no model, template or tool-call format. Each turn's actions are
stepped through that episode's environment. Finished episodes are replaced from the queue, so the batch stays
full. Malformed tool calls are answered with a tool error, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trace_cli.envs.base import Environment, Observation


@dataclass
class Turn:
    """One assistant turn as a policy hands it to the loop.

    `actions`: tool calls `{"name", "arguments"}`, malformed calls `{"malformed", "error"}` (answered with a
    tool error) and messages to the user `{"content"}`. `text`: what the assistant message of a turn with
    calls shows, when the turn was parsed from generated text (the text around the calls, or the raw turn
    when a call is malformed, so the transcript and the next prompt show what the agent wrote); None for a
    structured turn, whose message says what its `content` action says. `raw`: the generated text, if any.
    """

    actions: list[dict[str, Any]]
    text: str | None = None
    raw: str | None = None


@dataclass
class EpisodeState:
    """One episode in flight. `messages` is the full conversation, system prompt first."""

    env: Environment
    seed: int
    trial: int
    obs: Observation
    messages: list[dict[str, Any]]
    n_actions: int = 0
    n_errors: int = 0
    done: bool = False
    termination: str = ""
    gen_tokens: int = 0
    n_truncated: int = 0  # policy turns cut at max_new_tokens
    turns: list[dict[str, Any]] = field(default_factory=list)  # per policy turn: prompt/completion token ids
    kv: Any = None  # the policy's per-episode generation state (KV cache), dropped with the episode

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.obs.tools


@dataclass
class EpisodeResult:
    env: str
    seed: int
    trial: int
    task_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reward: float
    success: bool
    termination: str
    n_actions: int
    n_errors: int
    gen_tokens: int
    breakdown: dict[str, Any]
    metadata: dict[str, Any]  # hidden task metadata (family, required capabilities, reference actions)
    turns: list[dict[str, Any]] = field(default_factory=list)
    n_truncated: int = 0


def start(env: Environment, seed: int, trial: int = 0) -> EpisodeState:
    obs = env.reset(seed)
    messages = [{"role": "system", "content": obs.system_prompt}] + [dict(m) for m in obs.messages]
    return EpisodeState(env, seed, trial, obs, messages)


def apply_actions(
    state: EpisodeState,
    turn: Turn | Sequence[dict[str, Any]],
    *,
    max_turns: int,
    max_errors: int = 10,
) -> None:
    """Record one assistant turn (a Turn, or its bare list of actions) and step the environment for each
    action."""
    if not isinstance(turn, Turn):
        turn = Turn(list(turn))
    actions = turn.actions
    calls = [a for a in actions if "name" in a or "malformed" in a]
    begin = getattr(state.env, "begin_turn", None)
    if begin is not None and calls:
        # an environment that counts messages (τ²-bench: one assistant message however many calls it holds)
        n_bad = sum("malformed" in a for a in calls)
        begin(turn.text, len(calls) - n_bad, n_bad)
    if calls:
        ids = [f"call_{state.n_actions}_{i}" for i in range(len(calls))]
        msg: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if any("malformed" in a for a in calls):
            if turn.text is None:
                msg["content"] = "\n".join(
                    f"<tool_call>\n{a['malformed']}\n</tool_call>" for a in calls if "malformed" in a
                )
        else:
            msg["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": a["name"], "arguments": a["arguments"]}}
                for cid, a in zip(ids, calls, strict=True)
            ]
            if turn.text is None:  # a structured turn (an API model's tool_calls) may say something too
                msg["content"] = next(
                    (a["content"] for a in actions if "content" in a and "name" not in a), ""
                )
        state.messages.append(msg)
        for cid, a in zip(ids, calls, strict=True):
            if "malformed" in a:
                state.messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": cid,
                        "content": f"Error: malformed tool call: {a['error']}",
                        "error": True,
                    }
                )
                state.n_errors += 1
                continue
            res = state.env.step({"name": a["name"], "arguments": a["arguments"]})
            state.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": cid,
                    "name": a["name"],
                    "content": res.observation,
                    "error": bool(res.error),
                }
            )
            state.n_errors += int(bool(res.error))
            if res.done:
                state.done, state.termination = True, res.info.get("termination", "env_done")
                break
    else:
        content = actions[0].get("content", "") if actions else ""
        state.messages.append({"role": "assistant", "content": content})
        res = state.env.step({"content": content})
        if res.done:
            state.done, state.termination = True, res.info.get("termination", "user_stop")
        elif res.observation is not None:
            state.messages.append({"role": res.role or "user", "content": res.observation})
    state.n_actions += 1
    if not state.done and getattr(state.env, "own_budget", False):
        if getattr(state.env, "done", False):  # the environment ended it between calls (its budget)
            state.done, state.termination = True, getattr(state.env, "termination", None) or "env_done"
        return  # it counts its own steps and errors (τ²-bench's max_steps, max_errors)
    if not state.done and state.n_actions >= max_turns:
        state.done, state.termination = True, "max_turns"
    if not state.done and state.n_errors >= max_errors:
        state.done, state.termination = True, "too_many_errors"


def finish(state: EpisodeState) -> EpisodeResult:
    b = state.env.verify()
    meta = state.env.task_metadata()
    return EpisodeResult(
        env=getattr(state.env, "name", type(state.env).__name__),
        seed=state.seed,
        trial=state.trial,
        task_id=state.obs.task_id,
        messages=state.messages,
        tools=state.tools,
        reward=float(b.reward),
        success=bool(b.success),
        termination=state.termination or "unknown",
        n_actions=state.n_actions,
        n_errors=state.n_errors,
        gen_tokens=state.gen_tokens,
        breakdown={"components": b.components, "details": b.details},
        metadata=meta,
        turns=state.turns,
        n_truncated=state.n_truncated,
    )


def rollout(
    policy,
    make_env: Callable[[], Environment],
    jobs: Sequence[tuple[int, int]],
    *,
    max_turns: int,
    batch_size: int = 16,
    on_done: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Run `jobs` [(seed, trial), ...] with `policy` (trace_cli.agents.base.Policy: `act(states)` gives one
    structured turn per state, a Turn or a bare list of actions; an optional `begin(state)` sees each episode
    first); results come back in job order."""
    queue = list(enumerate(jobs))
    active: list[tuple[int, EpisodeState]] = []
    results: dict[int, EpisodeResult] = {}
    pool: ThreadPoolExecutor | None = None
    try:
        while queue or active:
            fresh: list[tuple[int, Environment, int, int]] = []
            while queue and len(active) + len(fresh) < batch_size:
                idx, (seed, trial) = queue.pop(0)
                fresh.append((idx, make_env(), seed, trial))
            if fresh:
                pool = pool or _pool_for([env for _, env, _, _ in fresh], batch_size)
                started = _each(pool, lambda job: start(job[1], job[2], job[3]), fresh)
                for (idx, *_), st in zip(fresh, started, strict=True):
                    if hasattr(policy, "begin"):
                        policy.begin(st)
                    active.append((idx, st))
            outputs = policy.act([s for _, s in active])
            for turn in outputs:
                if isinstance(turn, str | bytes):
                    raise TypeError(
                        f"{type(policy).__name__}.act returned text: policies return structured turns (a Turn, "
                        "or a list of actions); trace_cli.agents.base.text_turn parses generated text into one"
                    )
            _each(
                pool,
                lambda pair: apply_actions(pair[0][1], pair[1], max_turns=max_turns),
                zip(active, outputs, strict=True),
            )
            active = _finish_done(active, results, on_done)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return [results[i] for i in range(len(jobs))]


def _pool_for(envs: list[Environment], batch_size: int) -> ThreadPoolExecutor | None:
    """Threads for environments whose steps wait on a server (`concurrent_steps`: τ²-bench's LLM user), so the
    user turns of one round reach it together and a batching server batches them; None: step in order."""
    if batch_size > 1 and any(getattr(env, "concurrent_steps", False) for env in envs):
        return ThreadPoolExecutor(max_workers=batch_size, thread_name_prefix="env-step")
    return None


def _each(pool: ThreadPoolExecutor | None, fn: Callable[[Any], Any], items: Any) -> list[Any]:
    items = list(items)
    if pool is None or len(items) < 2:
        return [fn(x) for x in items]
    return list(pool.map(fn, items))


def _finish_done(
    active: list[tuple[int, EpisodeState]],
    results: dict[int, EpisodeResult],
    on_done: Callable[[EpisodeResult], None] | None,
) -> list[tuple[int, EpisodeState]]:
    still: list[tuple[int, EpisodeState]] = []
    for idx, st in active:
        if st.done:
            res = finish(st)
            results[idx] = res
            if on_done:
                on_done(res)
        else:
            still.append((idx, st))
    return still


# a fixed plan is never cut short by the loop's cap (it ends where the plan or the environment does)
REPLAY_CAP = 1000


def replay(env: Environment, seed: int, actions: Sequence[dict[str, Any]]) -> EpisodeResult:
    """Run a fixed action list (reference solution or a demonstration) and return the episode."""
    st = start(env, seed)
    for a in actions:
        if st.done:
            break
        apply_actions(st, [a], max_turns=REPLAY_CAP)
    if not st.done:
        st.termination = "end_of_actions"
    return finish(st)
