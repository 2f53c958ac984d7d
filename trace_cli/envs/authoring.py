"""LLM-authored environments: the analyst LLM writes an environment module for one capability.

The prompt gives the capability (name, description), a few failed trajectories the diagnosis cites, the
target's tool schemas, and the module contract (see `trace_cli.envs.sandbox`) with a compact example built
on `SyntheticEnv`. The answer is JSON `{"module": "<python source>"}` (or a fenced python block). Requests go
through the diagnose analysts (`openai`: any OpenAI-compatible server, over the one SDK client in
`trace_cli.llm.openai_client` with the SDK's retries and timeouts; `hf`: a local model), so they share the
store's response cache. `author_module` runs the conversation: every module is checked in the sandbox (never
run here), a rejected one is sent back with the reason, up to `llm.attempts` times.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from trace_cli.errors import CheckFailed, UsageError, terminal_safe

CONTRACT = """Write ONE self-contained Python module (stdlib + trace_cli only; no network, no files outside the
working directory, no subprocesses) that defines `make_env(**params)` returning an environment with:
  name: str; max_turns: int
  reset(seed:int) -> trace_cli.envs.base.Observation   (system_prompt, tools, messages=[first user message], task_id, info)
  step(action:dict) -> trace_cli.envs.base.StepResult  (action: {"name","arguments"} tool call, or {"content"} message)
  verify() -> trace_cli.envs.base.RewardBreakdown      (reward in [0,1], success == (reward == 1), graded components)
  task_metadata() -> dict   with "answer_values": the ids/amounts/statuses the agent must find with tools
  reference_actions() -> list[dict]   actions that reach reward 1 from reset(seed)
Rules: same seed => same task (use random.Random(seed), never global randomness); the first user message
never contains an answer value; an agent that only says "Goodbye." must never succeed; reuse the target's
tool names and argument schemas exactly; rewards are programmatic (final state / exact arguments).
The easiest way: subclass trace_cli.envs.synthetic.base.SyntheticEnv: the target's world (its tools, policy and
database, on a small generated state; `world=` in params names it) runs the episode; `self.customer(rng, n)` draws a
world and a customer who identifies themselves; grade with `self.matches_target`, `self.changed`, `self.record`:

import random
from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, call, say
from trace_cli.envs.synthetic.common import identify, world
class Env(SyntheticEnv):
    capability = "example"
    TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip", "get_order_details", "cancel_pending_order")
    KNOBS = {"n_orders": Knob(int, 2, 10)}
    LEVELS = [{"n_orders": 3}, {"n_orders": 5}, {"n_orders": 8}]
    DEFAULT_LEVEL = 1
    WEIGHTS = {"db": 0.6, "communicate": 0.4}
    def build(self, rng: random.Random) -> Scenario:
        b, user, orders, ident, auth = self.customer(rng, self.knobs["n_orders"])
        order = rng.choice(orders); order["status"] = "pending"; oid = order["order_id"]
        ref = [auth, call("get_order_details", order_id=oid),
               call("cancel_pending_order", order_id=oid, reason="no longer needed"), say(f"Order {oid} is cancelled.")]
        return Scenario(b.db, user["user_id"], ident, f"Please cancel order {oid}; I no longer need it.", ref,
                        answers=[user["user_id"]], required_facts=["cancelled"], data={"order_id": oid})
    def grade(self):
        oid = self._scenario.data["order_id"]
        comm, missing, wrong = self.communicate()
        return {"db": float(self.matches_target("orders", oid)), "communicate": comm}, {"missing": missing}
def make_env(**params):
    return Env(**params)
"""


def module_params(params: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """An authored module's `make_env` params: the config's, and the target's world where it is not the shop
    (modules written before worlds take no `world`)."""
    world = target.get("world", "shop")
    return dict(params) if world == "shop" else {**params, "world": world}


def _trim(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def transcript(episode: dict[str, Any], limit: int = 1500) -> str:
    """A compact transcript of one episode (roles, tool calls, results), cut to `limit` characters."""
    lines = []
    for m in episode.get("messages") or []:
        role = m.get("role")
        if role == "system":
            continue
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments")
            lines.append(
                f"assistant calls {fn.get('name')}({_trim(json.dumps(args) if not isinstance(args, str) else args, 200)})"
            )
        if m.get("content"):
            lines.append(f"{role}: {_trim(m['content'], 300)}")
    out = "\n".join(lines)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def author_messages(
    capability: str,
    description: str,
    tools: list[dict[str, Any]],
    examples: list[str],
    feedback: str | None = None,
    world: str = "shop",
) -> list[dict[str, str]]:
    ex = (
        "\n\n".join(f"Failed trajectory {i + 1}:\n{e}" for i, e in enumerate(examples[:3]))
        or "(none available)"
    )
    user = (
        f"Capability to train: {capability}\n{description}\n\n"
        f"Target tool schemas (reuse names and argument schemas exactly):\n{json.dumps(tools, separators=(',', ':'))}\n\n"
        f"Failures of the current agent that this capability explains:\n{ex}\n\n{CONTRACT}\n"
        f"The target's world is {world!r}: make_env(**params) receives world={world!r}; pass it on to "
        "SyntheticEnv, whose episodes then offer every tool of the target and answer with the world's own tools.\n"
        "Isolate this one capability; give the environment difficulty knobs. "
        'Answer with JSON: {"module": "<the complete python source>"}.'
    )
    if feedback:
        user += f"\n\nYour previous module was rejected: {feedback}\nFix that and answer with the complete module."
    return [
        {"role": "system", "content": "You write verifiable training environments for tool-using agents."},
        {"role": "user", "content": user},
    ]


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def parse_module(text: str) -> str:
    from trace_cli.analysts.prompts import AnalystResponseError

    src = None
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("module"), str):
            src = doc["module"]
    except ValueError:
        m = _FENCE.search(text)
        if m:
            src = m.group(1)
    if not src or "def make_env" not in src and "class Env" not in src:
        raise AnalystResponseError("no module with make_env(**params) or class Env in the answer")
    return src


def write_module(
    author: str, llm: dict[str, Any], store: Any, messages: list[dict[str, str]], *, seed: int, attempt: int
) -> tuple[str | None, str | None]:
    """(module source, None) or (None, why the LLM gave none)."""
    if author == "openai":
        from trace_cli.analysts.openai import OpenAIAnalyst

        analyst = OpenAIAnalyst({"llm": llm}, store)
        return analyst._ask(messages, run=attempt, seed=seed, parse=parse_module)
    if author == "hf":
        from trace_cli.analysts.hf import HFAnalyst

        analyst = HFAnalyst({"llm": llm}, store)
        return analyst._ask_many(
            [messages], run=attempt, seed=seed, parse=parse_module, what=f"authoring (attempt {attempt})"
        )[0]
    raise UsageError(f"unknown author {author!r}; expected template, openai or hf")


def examples(
    store: Any, diagnosis_doc: dict[str, Any], capability_doc: dict[str, Any], n: int = 3
) -> list[str]:
    """Transcripts of a few failed episodes the diagnosis cites for the capability."""
    from trace_cli.store.rollouts import read_episodes

    try:
        art = store.resolve(diagnosis_doc["rollouts"], kind="rollouts")
        eps = read_episodes(art.path)
    except (UsageError, KeyError, OSError):
        return []
    want = [str(t) for t in capability_doc.get("example_failed_task_ids") or []]
    out = []
    for tid in want:
        ep = next((e for e in eps if str(e["task_id"]) == tid and not e["success"]), None)
        if ep is not None:
            out.append(transcript(ep))
        if len(out) >= n:
            break
    return out


# While the LLM writes modules, each one is pre-screened in the sandbox with these checks capped (every call crosses
# the sandbox's pipe); the module that passes is then admitted by the full checks with the config's own counts
# (`envs.synthetic.checks.admit`). The environment artifact records the pre-screen's counts (`authoring.prescreen`).
PRESCREEN_CAPS = {"determinism_seeds": 10, "do_nothing_seeds": 50, "leakage_seeds": 50}


def prescreen_seeds(checks: dict[str, Any]) -> dict[str, int]:
    """The seed counts of the sandboxed pre-screen: the config's `checks`, capped by PRESCREEN_CAPS."""
    return {k: min(v, PRESCREEN_CAPS[k]) if k in PRESCREEN_CAPS else v for k, v in checks.items()}


def author_module(
    cfg: dict[str, Any],
    store: Any,
    *,
    capability_doc: dict[str, Any],
    diagnosis_doc: dict[str, Any],
    target: dict[str, Any],
    limits: Any,
    has_template: bool,
) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """Ask the LLM for modules until one passes the sandboxed checks (`cfg`: the synthesize config).

    Returns (the accepted module's source, the log of every attempt, None), or (None, log, "template") when
    every module was rejected and the config falls back to the capability's template (with a notice on stderr;
    `strict` makes that a CheckFailed too). A module that tried a
    forbidden action (files outside its directory, processes, the network, introspection) means the authoring
    channel is not trustworthy (the prompt embeds third-party rollout text): CheckFailed, no fallback, no later
    attempt; so is a run with every module rejected and no template to fall back to."""
    from trace_cli.envs.artifact import MODULES_DIR
    from trace_cli.envs.sandbox import SandboxedEnv, SandboxWorker, check_module, isolation
    from trace_cli.envs.synthetic.checks import check_tools

    isolation(cfg["unsafe_local_exec"])  # no OS sandbox and no explicit consent: exit 2 before any request
    cap = cfg["capability"]
    shown = examples(store, diagnosis_doc, capability_doc)
    llm = {k: v for k, v in cfg["llm"].items() if k not in ("attempts", "fallback")}
    chk = cfg["checks"]
    log: list[dict[str, Any]] = []
    feedback = None
    for attempt in range(1, cfg["llm"]["attempts"] + 1):
        world = target.get("world", "shop")
        msgs = author_messages(
            cap, capability_doc["description"], list(target["tools"].values()), shown, feedback, world
        )
        src, why = write_module(cfg["author"], llm, store, msgs, seed=cfg["seed"], attempt=attempt)
        if src is None:
            log.append({"file": None, "accepted": False, "reason": f"no usable module: {why}"})
            feedback = why
            continue
        verdict = check_module(
            src,
            module_params(cfg["params"], target),
            limits,
            **prescreen_seeds(chk),
            unsafe_local_exec=cfg["unsafe_local_exec"],
        )
        entry = {
            "file": f"{MODULES_DIR}/attempt-{attempt}.py",
            "accepted": verdict.accepted,
            "reason": verdict.reason,
            "source": src,
        }
        if verdict.accepted:
            params = module_params(cfg["params"], target)
            with SandboxWorker(
                src, limits, unsafe_local_exec=cfg["unsafe_local_exec"], world=params.get("world")
            ) as w:
                tc = check_tools(
                    SandboxedEnv(w, params),
                    target["tools"],
                    fallback_ok=target["kind"] == "env",
                )
            if not tc["passed"]:
                entry.update(accepted=False, reason=f"check tools failed: {tc['message']}")
        log.append(entry)
        if entry["accepted"]:
            return src, log, None
        if entry["reason"].startswith("blocked:"):  # a forbidden action: stop asking this author
            break
        feedback = entry["reason"]
    blocked = [(i + 1, m["reason"]) for i, m in enumerate(log) if m["reason"].startswith("blocked:")]
    if blocked:
        i, why = blocked[0]
        raise _refused(
            f"attempt {i} of the {cfg['author']} author wrote a module for {cap} that tried a forbidden action "
            f"({why}); refusing to store any environment from this author run",
            cap,
            log,
        )
    reasons = "; ".join(f"attempt {i + 1}: {m['reason']}" for i, m in enumerate(log))
    rejected = f"every module the {cfg['author']} author wrote for {cap} was rejected ({reasons})"
    if cfg["llm"]["fallback"] == "template" and has_template and not cfg.get("strict"):
        print(
            terminal_safe(  # the reasons quote the modules' own errors: untrusted text
                f"notice: {rejected}; falling back to the built-in template of {cap} (--strict makes this an "
                "error)"
            ),
            file=sys.stderr,
            flush=True,
        )
        return None, log, "template"
    raise _refused(rejected + ("; strict: no fallback to the template" if has_template else ""), cap, log)


def _refused(message: str, capability: str, log: list[dict[str, Any]]) -> CheckFailed:
    err = CheckFailed(message)
    err.details = {
        "capability": capability,
        "modules": [{k: v for k, v in m.items() if k != "source"} for m in log],
    }
    return err
