"""`ShopEnv`: the built-in τ²-retail-style customer-service world, one procedurally generated task per seed.

Reward (documented contract, see `verify`):
  components["db"]          1 if the final users+orders equal the state the reference solution produces, else 0
  components["db_records"]  graded: share of user/order records equal to that state
  components["communicate"] graded: share of fact checks passed — required facts (amounts, statuses) found in
                            the agent's messages, forbidden facts (wrong statuses) absent from them
  reward = 1 only if db == 1 and every fact check passes, else 0 (all-or-nothing, like τ²-bench);
  success = reward == 1. The graded components are there for analysis or for shaped training rewards.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from trace_cli.envs.base import Observation, RewardBreakdown
from trace_cli.envs.conversation import ScriptedConversation
from trace_cli.envs.shop.tasks import CAPABILITIES, FAMILIES, FAMILY_CAPABILITIES, Task
from trace_cli.envs.shop.tools import TOOL_SCHEMAS, ShopTools, ToolError
from trace_cli.envs.validation import decode_tool_call, validate_arguments
from trace_cli.envs.worlds.facts import clone, fact_communicated
from trace_cli.envs.worlds.user import ScriptedUser
from trace_cli.errors import UsageError

# Kept short on purpose: a tiny model is trained on these transcripts (≤ ~600 characters).
POLICY = """You are a customer service agent for an online shop.
- First authenticate the user: find their user id by email, or by name and zip.
- Help only that one user.
- Check an order's status before changing it. Only pending orders can be cancelled (reason: 'no longer needed' or 'ordered by mistake'). Only delivered orders can be returned or exchanged.
- Refunds go to the original payment method or a gift card.
- Take ids and amounts from tool results; never guess.
- Make one tool call or send one message at a time.
- Transfer to a human agent only if you cannot help."""


class ShopEpisodes(ScriptedConversation):
    """The episode machinery of the shop and of its synthetic capability environments.

    A task (database + reference solution) is loaded once per seed (`_load`): the target state is what the
    reference leaves, replayed once, so reward and reference can never drift apart. Each episode (`_start`)
    runs the shop's tools on a fresh copy of the database, with a scripted user and an empty transcript."""

    _loaded: Any = None  # the task of the last new seed (a shop Task, a template's Scenario: .db, .reference)
    _seed: int | None = None

    def _load(self, task: Any, seed: int) -> None:
        self._loaded, self._seed = task, seed
        db = task.db
        # Products never change during an episode, so only users and orders are copied per episode.
        self._products = db["products"]
        self._initial = clone({"users": db["users"], "orders": db["orders"]})
        tools = ShopTools(self._fresh_db())
        for action in task.reference:
            if "name" in action:
                tools.call(action["name"], clone(action["arguments"]))  # a ToolError here is a bug
        self._target = {"users": tools.db["users"], "orders": tools.db["orders"]}

    def _started(self) -> Any:
        """The current task; a usage error before the first reset."""
        if self._loaded is None:
            raise UsageError("call reset(seed) before using the environment")
        return self._loaded

    def _fresh_db(self) -> dict[str, Any]:
        return {"products": self._products, **clone(self._initial)}

    def reference_actions(self) -> list[dict[str, Any]]:
        return clone(self._started().reference)

    def _metadata(self, family: str, **extra: Any) -> dict[str, Any]:
        """`task_metadata()`: what every task has, with the environment's own keys (`extra`) in the middle."""
        task = self._started()
        return {
            "task_id": self.task_id,
            "family": family,
            "variant": task.variant,
            **extra,
            "required_facts": list(task.required_facts),
            "forbidden_facts": list(task.forbidden_facts),
            "reference_actions": self.reference_actions(),
        }

    def _start(self, user: ScriptedUser) -> None:
        self.db = self._fresh_db()
        self.api = ShopTools(self.db)
        self.user = user
        self.turns = 0
        self._calls_in_turn = 0  # a new episode starts outside any turn (ScriptedConversation)
        self.done = False
        self.termination: str | None = None
        self.agent_messages: list[str] = []

    def _run_tool(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """A call whose arguments passed the schema, run on the episode's database: (observation, error)."""
        try:
            return self.api.call(name, copy.deepcopy(args)), False
        except ToolError as exc:
            return f"Error: {exc}", True


class ShopEnv(ShopEpisodes):
    """One task per `reset(seed)`; satisfies `trace_cli.envs.base.Environment`."""

    name = "shop"

    def __init__(
        self,
        families: list[str] | None = None,
        max_turns: int = 12,
        n_orders: int = 5,
        tool_set: str = "task",
    ):
        self.families = list(families) if families else list(FAMILIES)
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise UsageError(
                f"shop: parameter 'families': unknown task family {unknown[0]!r}; "
                f"known: {', '.join(FAMILIES)}"
            )
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise UsageError(f"shop: parameter 'max_turns' must be a positive integer, got {max_turns!r}")
        if not isinstance(n_orders, int) or isinstance(n_orders, bool) or not 4 <= n_orders <= 10:
            raise UsageError(f"shop: parameter 'n_orders' must be an integer from 4 to 10, got {n_orders!r}")
        if tool_set not in ("task", "all"):
            raise UsageError(f"shop: parameter 'tool_set' must be 'task' or 'all', got {tool_set!r}")
        self.max_turns = max_turns
        self.n_orders = n_orders
        self.tool_set = tool_set

    # -- protocol ----------------------------------------------------------------------------------
    def family_for_seed(self, seed: int) -> str:
        # Round-robin over the enabled families: any run of consecutive seeds is balanced.
        return self.families[seed % len(self.families)]

    def reset(self, seed: int) -> Observation:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"seed must be an integer, got {seed!r}")
        if self._task is None or (self._seed, self._task_key) != (seed, self._key(seed)):
            self._load(self._build(seed), seed)
            self._task_key = self._key(seed)
        # else: resetting to the current seed again (e.g. several rollouts of one task) reuses the task.
        task = self._task
        self._start(self._user(task))
        names = list(TOOL_SCHEMAS) if self.tool_set == "all" else task.tools
        self._tools = {n: TOOL_SCHEMAS[n] for n in names}
        return Observation(
            system_prompt=POLICY,
            tools=[clone(TOOL_SCHEMAS[n]) for n in names],
            messages=[{"role": "user", "content": task.first_message}],
            task_id=self.task_id,
            info={"env": self.name, "seed": seed, "max_turns": self.max_turns},
        )

    _task_key: Any = None

    def _user(self, task: Task) -> ScriptedUser:
        """The scripted user of an episode (shop-mixed's reveals its later requests in turn)."""
        return ScriptedUser(task.identify, task.request, getattr(task, "later", ()))

    def _key(self, seed: int) -> Any:
        """What besides the seed decides the task (the family, for the shop): a change reloads it."""
        return self.family_for_seed(seed)

    def _build(self, seed: int) -> Task:
        """The task of a seed. A string seed is hashed deterministically by `random` (not by PYTHONHASHSEED);
        mixing in the family keeps tasks independent when the family list changes."""
        family = self.family_for_seed(seed)
        return FAMILIES[family](random.Random(f"shop:{family}:{seed}"), self.n_orders)

    @property
    def _task(self) -> Task | None:
        """The current task (None before the first reset)."""
        return self._loaded

    @property
    def task_id(self) -> str:
        return f"shop-{self._started().family}-{self._seed}"

    def _tool_call(self, action: dict[str, Any]) -> tuple[str, bool]:
        name, args, bad = decode_tool_call(action, self._tools)
        if bad:
            return bad, True
        problems = validate_arguments(self._tools[name], args)
        if problems:
            return f"Error: {name}: " + "; ".join(problems), True
        return self._run_tool(name, args)

    def verify(self) -> RewardBreakdown:
        task = self._started()
        records = [(table, key) for table in ("users", "orders") for key in self._target[table]]
        mismatched = [k for table, k in records if self.db[table].get(k) != self._target[table][k]]
        db_ok = not mismatched and all(set(self.db[t]) == set(self._target[t]) for t in ("users", "orders"))
        messages = self.agent_messages
        missing = [f for f in task.required_facts if not fact_communicated(f, messages)]
        wrong = [f for f in task.forbidden_facts if fact_communicated(f, messages)]
        n_checks = len(task.required_facts) + len(task.forbidden_facts)
        communicate = 1.0 if not n_checks else (n_checks - len(missing) - len(wrong)) / n_checks
        reward = 1.0 if db_ok and not missing and not wrong else 0.0
        return RewardBreakdown(
            reward=reward,
            success=reward == 1.0,
            components={
                "db": float(db_ok),
                "db_records": 1 - len(mismatched) / len(records),
                "communicate": communicate,
            },
            details={
                "mismatched_records": mismatched,
                "missing_facts": missing,
                "wrong_facts": wrong,
                "termination": self.termination,
                "turns": self.turns,
            },
        )

    def task_metadata(self) -> dict[str, Any]:
        task = self._started()
        return self._metadata(task.family, required_capabilities=list(task.capabilities))

    def demonstration(self, deficits: set[str] | list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The reference solution with the named capabilities withheld (behaviour known to fail by construction).

        Only capabilities this task requires change anything: for other tasks the demonstration is the
        reference. Known deficit names: `CAPABILITIES`.
        """
        task = self._started()
        unknown = sorted(set(deficits) - set(CAPABILITIES))
        if unknown:
            raise UsageError(f"unknown deficit {unknown[0]!r}; known: {', '.join(CAPABILITIES)}")
        for capability in task.capabilities:
            if capability in deficits:
                return clone(task.deficit_demos[capability])
        return self.reference_actions()


class ShopMixedEnv(ShopEnv):
    """`shop-mixed`: one conversation with 1-4 requests, all of which must be right (see `tasks.mixed`).

    Same tools, user simulator and verifier as `shop`, but every task offers every tool (`tool_set="all"`: the
    tools do not reveal the task) and the user states one request at a time; the task of a seed is drawn by
    `tasks.mixed.build_task` (its family is a shop family for one request, `mixed<k>` for k requests).
    `families` does not apply."""

    name = "shop-mixed"

    def __init__(self, max_turns: int = 16, n_orders: int = 5, tool_set: str = "all"):
        super().__init__(max_turns=max_turns, n_orders=n_orders, tool_set=tool_set)

    def family_for_seed(self, seed: int) -> str:
        return "mixed"  # the family is drawn with the task (so the seed alone decides it)

    def _build(self, seed: int) -> Task:
        from trace_cli.envs.shop.tasks.mixed import build_task

        return build_task(seed, self.n_orders)

    @property
    def task_id(self) -> str:
        return f"shop-mixed-{self._started().family}-{self._seed}"


def family_capabilities() -> dict[str, list[str]]:
    """Task family -> required capabilities (hidden metadata, for analysis and tests)."""
    return {k: list(v) for k, v in FAMILY_CAPABILITIES.items()}
