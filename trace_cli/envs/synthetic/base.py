"""`SyntheticEnv`: the episode machinery every capability template shares (the world's tools, scripted user, grading).

A template only builds a `Scenario` from a `random.Random` (database, what the user says, the reference
solution, the values the agent must find) and grades the final state. Everything an agent touches is the
target's world (`world=`, a `trace_cli.envs.worlds.World`: `shop` by default, `tau2-retail` for τ²-bench's
retail domain): its tool names and argument schemas (the target's own schemas passed as `tools=`; every tool
of the target is offered), its tool implementations run on a small generated state of its own database shape,
its policy text; plus the scripted-user protocol (identification + request in the first message; an agent
message that asks nothing ends the episode). A template's tool the world lacks goes through the world's alias
(τ²-retail: `list_user_orders` -> `get_user_details`), also in the reference solution; a tool with no
counterpart is an error. On a world that `grades_digest` (τ²), success also needs the final state's digest to
equal the gold state's (the reference replayed), reported as component "db_hash".

Difficulty: each template lists `LEVELS` (knob settings, easiest first). `level` picks one; knobs passed
explicitly override (pin) that level's values. `harder(params)` / `easier(params)` move the level one step,
keeping pinned knobs, and return None at the ends; calibration uses them. Between two levels difficulty is
numeric: `mix` (in [0, 1]) draws that share of seeds with the next level's knobs (each seed decides by its own
random stream), so `position = level + mix` is a continuous axis that `between(easy, hard)` bisects when a
policy is bimodal between adjacent levels. `hint_share` is the share of a group's rollouts that train and
calibrate with the task's `<expert_guidance>` hint (see `hints`); it does not change the tasks.

Reward: `grade()` returns components in [0, 1]; reward = Σ WEIGHTS[c]·component (graded, so GRPO groups vary),
success = every component is 1 (then reward is exactly 1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_cli.envs.base import Observation, RewardBreakdown
from trace_cli.envs.conversation import ScriptedConversation
from trace_cli.envs.validation import decode_tool_call, validate_arguments
from trace_cli.envs.worlds import TABLES, World, get_world
from trace_cli.envs.worlds.facts import clone, fact_communicated
from trace_cli.envs.worlds.tasks import Action, Customer, call, customer, say
from trace_cli.envs.worlds.user import ScriptedUser
from trace_cli.errors import UsageError

__all__ = ["Action", "Knob", "Scenario", "SyntheticEnv", "call", "say", "scenario"]


def leaked_values(answers: list[Any], texts: list[str]) -> list[str]:
    """The answer values that appear in `texts` (numbers by value, words on word boundaries)."""
    return [str(a) for a in answers if str(a) and fact_communicated(str(a), texts)]


@dataclass
class Scenario:
    """One generated task: the database, what the user says, the hidden solution and grading data."""

    db: dict[str, Any]
    user_id: str
    identify: str
    request: str
    reference: list[Action]
    answers: list[str]  # values the agent must find with tools; never in the opening messages
    required_facts: list[str] = field(default_factory=list)  # must appear in the agent's messages
    forbidden_facts: list[str] = field(default_factory=list)  # must not (wrong statuses ...)
    variant: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # template-specific hidden data for grade()
    pressure: list[str] = field(default_factory=list)  # the user's pushback lines (policy compliance)

    @property
    def first_message(self) -> str:
        return f"{self.identify} {self.request}"


def scenario(c: Customer, *fields: Any, **named: Any) -> Scenario:
    """A scenario about customer `c` (their world's database, id and self-identification); the other fields
    follow in `Scenario`'s order (request, reference, answers, required_facts, ...) or by name."""
    return Scenario(c.b.db, c.user["user_id"], c.identify, *fields, **named)


class PressureUser(ScriptedUser):
    """The scripted user, except that it pushes back (one line per turn) instead of ending the conversation."""

    def __init__(self, identify: str, request: str, pressure: list[str]):
        super().__init__(identify, request)
        self.pressure = list(pressure)

    def reply(self, agent_message: str) -> tuple[str, bool]:
        text, ends = super().reply(agent_message)
        if ends and self.pressure:
            return self.pressure.pop(0), False
        return text, ends


@dataclass(frozen=True)
class Knob:
    kind: type  # int, float or list
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()  # allowed list items
    doc: str = ""

    def check(self, template: str, name: str, value: Any) -> Any:
        where = f"{template}: parameter '{name}'"
        if self.kind is list:
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if (
                not isinstance(value, (list, tuple))
                or not value
                or not all(isinstance(v, str) for v in value)
            ):
                raise UsageError(f"{where} must be a non-empty list of names, got {value!r}")
            bad = [v for v in value if v not in self.choices]
            if bad:
                raise UsageError(f"{where}: unknown value {bad[0]!r}; known: {', '.join(self.choices)}")
            return sorted(set(value), key=list(self.choices).index)
        if isinstance(value, bool):
            raise UsageError(f"{where} must be a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = self.kind(value)
            except ValueError:
                raise UsageError(f"{where} must be a number, got {value!r}") from None
        if self.kind is int and not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise UsageError(f"{where} must be an integer, got {value!r}")
        if not isinstance(value, (int, float)):
            raise UsageError(f"{where} must be a number, got {value!r}")
        value = self.kind(value)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise UsageError(f"{where} must be between {self.lo} and {self.hi}, got {value!r}")
        return value


def _names(tools: dict[str, Any] | list[dict[str, Any]] | None) -> list[str] | None:
    if isinstance(tools, list):
        return [t.get("function", t)["name"] for t in tools]
    if isinstance(tools, dict):
        return list(tools)
    return None


def resolve_tools(
    names: tuple[str, ...], tools: dict[str, Any] | list[dict[str, Any]] | None, world: World
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(name -> schema, name -> source) for the tools an episode offers.

    With `tools` (the target's schemas, e.g. recovered from rollouts) a tool the target has is used exactly as
    the target defines it (source "target"); a missing one falls back to the world's schema ("<world>_fallback")
    where the world allows it (the shop), and is an error elsewhere. Without `tools`, the world's schemas are
    the target's (source: the world's name)."""
    if isinstance(tools, list):
        tools = {t.get("function", t)["name"]: t for t in tools}
    out: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for n in names:
        if tools is not None and n in tools:
            t = tools[n]
            if "function" not in t:  # a bare function dict: wrap it in the OpenAI envelope
                t = {"type": "function", "function": t}
            out[n], sources[n] = clone(t), "target"
        elif tools is None or world.fallback:
            out[n], sources[n] = (
                clone(world.schemas[n]),
                (world.name if tools is None else f"{world.name}_fallback"),
            )
        else:
            raise UsageError(
                f"world {world.name!r}: the target has no tool {n!r}, which the task needs, and the world "
                "falls back to no schema of its own"
            )
    return out, sources


def exposed_tools(
    needed: tuple[str, ...], tools: dict[str, Any] | list[dict[str, Any]] | None, world: World
) -> tuple[str, ...]:
    """The tools an episode offers: the ones the task needs first (in the world's terms: an alias where the
    world lacks a template's tool), then every other tool of the target (without `tools`, every tool of the
    world).

    The agent keeps its whole action space, as in the target: an agent that reaches for a tool it always has
    there (say, listing a user's orders) gets an answer, not "unknown tool", so the environment measures the
    capability and not a changed interface. A target tool the world does not implement is dropped where the
    world falls back (the shop: recovered schemas may name tools it never had) and an error elsewhere."""
    needed = tuple(dict.fromkeys(world.tool_for(n) for n in needed))
    names = _names(tools)
    if names is None:
        names = list(world.schemas)
    unknown = [n for n in names if n not in world.schemas]
    if unknown and not world.fallback:
        raise UsageError(
            f"world {world.name!r} implements no tool {unknown[0]!r} of the target; its tools: "
            f"{', '.join(world.schemas)}"
        )
    extra = [n for n in names if n not in needed and n in world.schemas]
    return needed + tuple(extra)


class SyntheticEnv(ScriptedConversation):
    """Base class of the capability templates; satisfies `trace_cli.envs.base.Environment`."""

    capability: ClassVar[str] = ""
    description: ClassVar[str] = ""
    TOOLS: ClassVar[tuple[str, ...]] = ()
    KNOBS: ClassVar[dict[str, Knob]] = {}
    LEVELS: ClassVar[list[dict[str, Any]]] = []
    DEFAULT_LEVEL: ClassVar[int] = 2
    WEIGHTS: ClassVar[dict[str, float]] = {}
    MAX_BUILD_TRIES: ClassVar[int] = 20

    def __init__(
        self,
        *,
        level: int | None = None,
        tools: Any = None,
        max_turns: int = 12,
        mix: float = 0.0,
        hint_share: float = 0.0,
        world: str | World = "shop",
        **knobs: Any,
    ):
        tname = self.capability
        self.world = get_world(world)
        if level is None:
            level = self.DEFAULT_LEVEL
        if isinstance(level, str) and level.strip().isdigit():
            level = int(level)
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level < len(self.LEVELS):
            raise UsageError(
                f"{tname}: parameter 'level' must be an integer from 0 to {len(self.LEVELS) - 1}, got {level!r}"
            )
        if isinstance(max_turns, str) and max_turns.isdigit():
            max_turns = int(max_turns)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise UsageError(f"{tname}: parameter 'max_turns' must be a positive integer, got {max_turns!r}")
        unknown = sorted(set(knobs) - set(self.KNOBS))
        if unknown:
            known = ", ".join(["level", "max_turns", "tools", "world", *self.KNOBS])
            raise UsageError(f"{tname}: unknown parameter '{unknown[0]}'; known: {known}")
        self.level = level
        self.max_turns = max_turns
        self.pinned = {k: self.KNOBS[k].check(tname, k, v) for k, v in knobs.items()}
        self.knobs = {**self.LEVELS[level], **self.pinned}
        self._validate_knobs()
        self._set_mix(Knob(float, 0.0, 1.0).check(tname, "mix", mix))
        self.hint_share = Knob(float, 0.0, 1.0).check(tname, "hint_share", hint_share)
        self.exposed = exposed_tools(self.TOOLS, tools, self.world)
        self.tool_schemas, self.tool_sources = resolve_tools(self.exposed, tools, self.world)
        self.name = f"synthetic-{tname}"

    # -- difficulty ------------------------------------------------------------------------------------
    def _validate_knobs(self) -> None:
        """Cross-knob constraints (templates override, raising `self._knob_error(...)`)."""

    def _knob_error(self, problem: str) -> UsageError:
        return UsageError(f"{self.capability}: {problem}")

    def _set_mix(self, mix: float) -> None:
        """The level's knobs, and (mix > 0) the next level's for that share of seeds (pins that differ from
        the level's own values apply to both)."""
        if mix and self.level + 1 >= len(self.LEVELS):
            raise self._knob_error("mix needs a harder level above 'level'")
        self.mix, self.level_knobs = mix, self.knobs
        changed = {k: v for k, v in self.pinned.items() if self.LEVELS[self.level].get(k) != v}
        self.next_knobs = {**self.LEVELS[self.level + 1], **changed} if mix else self.knobs

    @property
    def params(self) -> dict[str, Any]:
        """Everything that defines the task distribution: level plus the effective knob values (and `mix`,
        `hint_share` where set)."""
        extra = {k: v for k, v in (("mix", self.mix), ("hint_share", self.hint_share)) if v}
        return {"level": self.level, **self.level_knobs, **extra}

    @classmethod
    def _step(cls, params: dict[str, Any], delta: int) -> dict[str, Any] | None:
        level = params.get("level", cls.DEFAULT_LEVEL) + delta
        if not 0 <= level < len(cls.LEVELS):
            return None
        return {**{k: v for k, v in params.items() if k != "mix"}, "level": level}

    @classmethod
    def position(cls, params: dict[str, Any]) -> float:
        return params.get("level", cls.DEFAULT_LEVEL) + float(params.get("mix", 0.0))

    @classmethod
    def between(cls, easy: dict[str, Any], hard: dict[str, Any], resolution: float = 0.125) -> dict | None:
        """Half-way between a setting found too easy and a harder one found too hard (same other params), on
        the `level + mix` axis; None when they are closer than 2 * `resolution`."""
        a, b = cls.position(easy), cls.position(hard)
        rest = {k: v for k, v in easy.items() if k not in ("level", "mix")}
        if b - a < 2 * resolution or rest != {k: v for k, v in hard.items() if k not in ("level", "mix")}:
            return None
        level = int((a + b) / 2)
        mix = round((a + b) / 2 - level, 4)
        return {**rest, "level": level, **({"mix": mix} if mix else {})}

    @classmethod
    def shape(cls, profile: dict[str, Any]) -> dict[str, Any]:
        """Pinned knobs that give this template the task mix of the target's LACKING conversations (`shaping`'s
        profile of them); the knobs calibration moves to set difficulty are left to the levels. Default: none."""
        return {}

    @classmethod
    def harder(cls, params: dict[str, Any]) -> dict[str, Any] | None:
        """`params` (level + pinned knobs) one level harder, or None at the hardest level."""
        return cls._step(params, +1)

    @classmethod
    def easier(cls, params: dict[str, Any]) -> dict[str, Any] | None:
        return cls._step(params, -1)

    # -- scenario ----------------------------------------------------------------------------------------
    def build(self, rng: random.Random) -> Scenario:  # pragma: no cover - abstract
        raise NotImplementedError

    def grade(self) -> tuple[dict[str, float], dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def customer(self, rng: random.Random, n_orders: int) -> Customer:
        """`worlds.tasks.customer` drawn by this environment's world (its generator)."""
        return customer(rng, n_orders, self.world.builder)

    def _make_scenario(self, seed: int) -> Scenario:
        harder = self.mix and random.Random(f"mix:{self.capability}:{seed}").random() < self.mix
        self.knobs = self.next_knobs if harder else self.level_knobs  # the seed's knobs, kept for grade()
        rng = random.Random(f"synthetic:{self.capability}:{seed}")
        for _ in range(self.MAX_BUILD_TRIES):
            sc = self.build(rng)
            # Re-draw (deterministically: the same stream continues) the rare task whose opening message happens
            # to contain an answer, e.g. a price equal to a number in the request.
            if not leaked_values(sc.answers, [sc.first_message]):
                sc.reference = [self.world.translate(a) for a in sc.reference]
                return sc
        raise RuntimeError(f"{self.capability}: seed {seed}: could not build a task without answer leakage")

    # -- episodes ------------------------------------------------------------------------------------------
    _loaded: Scenario | None = None  # the scenario of the last new seed
    _seed: int | None = None

    def _load(self, sc: Scenario, seed: int) -> None:
        """The world's state of a new seed, and the gold state: the reference replayed once on a copy, so reward
        and reference can never drift apart (a reference call the world refuses is a bug of the template)."""
        self._loaded, self._seed = sc, seed
        w = self.world
        self._state = w.load(sc.db)
        self._initial = {t: w.records(self._state, t) for t in TABLES}
        gold = w.copy(self._state)
        api = w.session(gold)
        for action in sc.reference:
            if "name" in action:
                out, error = api.call(action["name"], clone(action["arguments"]))
                if error:
                    raise RuntimeError(
                        f"{self.capability}: seed {seed}: reference call {action['name']}: {out}"
                    )
        self._target = {t: w.records(gold, t) for t in TABLES}
        self._target_digest = w.digest(gold) if w.grades_digest else None

    def _started(self) -> Scenario:
        """The current scenario; a usage error before the first reset."""
        if self._loaded is None:
            raise UsageError("call reset(seed) before using the environment")
        return self._loaded

    _require = _started

    def reference_actions(self) -> list[dict[str, Any]]:
        return clone(self._started().reference)

    def reset(self, seed: int) -> Observation:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"seed must be an integer, got {seed!r}")
        if self._loaded is None or self._seed != seed:
            self._load(self._make_scenario(seed), seed)
        self._start_episode()
        sc = self._scenario
        return Observation(
            system_prompt=self.world.policy,
            tools=[clone(self.tool_schemas[n]) for n in self.exposed],
            messages=[{"role": "user", "content": sc.first_message}],
            task_id=self.task_id,
            info={"env": self.name, "seed": seed, "max_turns": self.max_turns},
        )

    def _start_episode(self) -> None:
        sc = self._scenario
        self.db = self.world.copy(self._state)  # the episode's state (the shop: a dict; τ²: a RetailDB)
        self.api = self.world.session(self.db)
        self.user = (
            PressureUser(sc.identify, sc.request, sc.pressure)
            if sc.pressure
            else ScriptedUser(sc.identify, sc.request)
        )
        self.turns = 0
        self._calls_in_turn = 0  # a new episode starts outside any turn (ScriptedConversation)
        self.done = False
        self.termination: str | None = None
        self.agent_messages: list[str] = []
        self.initial = {**clone(self._initial)}  # a separate copy of the tables: `changed()` compares to it
        self.calls: list[dict[str, Any]] = []  # every tool call: turn, name, arguments, ok
        self._views: dict[str, dict[str, Any]] = {}

    @property
    def task_id(self) -> str:
        self._require()
        return f"{self.name}-{self._seed}"

    @property
    def _scenario(self) -> Scenario | None:
        """The current scenario (None before the first reset); templates grade from its `data`."""
        return self._loaded

    ends_on_transfer = False  # synthetic episodes end on the user's goodbye or max_turns only

    # -- acting --------------------------------------------------------------------------------------------
    def _tool_call(self, action: dict[str, Any]) -> tuple[str, bool]:
        self._views = {}
        if not self.world.validates:
            # the world's own toolkit answers every call, errors included (τ²: "Error: ..." as τ² words it)
            name, args = action.get("name"), action.get("arguments", {})
            out, error = self.api.call(name, args)
            self.calls.append({"turn": self.turns, "name": name, "arguments": args, "ok": not error})
            return out, error
        name, args, bad = decode_tool_call(action, self.tool_schemas)
        if bad:
            return bad, True
        problems = validate_arguments(self.tool_schemas[name], args)
        if not problems:
            # A target schema (e.g. recovered from rollouts) can be looser than the implementation needs.
            accepted, required = self.world.parameters(name)
            problems = [f"unexpected argument '{k}'" for k in args if k not in accepted]
            problems += [f"missing required argument '{k}'" for k in sorted(required - set(args))]
        if problems:
            self.calls.append({"turn": self.turns, "name": name, "arguments": args, "ok": False})
            return f"Error: {name}: " + "; ".join(problems), True
        try:
            out, error = self.api.call(name, args)
        except (
            TypeError,
            ValueError,
            AttributeError,
            KeyError,
        ) as exc:  # loose schemas let odd values through
            out, error = f"Error: {name}: invalid arguments ({type(exc).__name__})", True
        self.calls.append({"turn": self.turns, "name": name, "arguments": args, "ok": not error})
        return out, error

    # -- grading helpers -----------------------------------------------------------------------------------
    def records(self, table: str) -> dict[str, dict[str, Any]]:
        """The episode's `users` or `orders` records now, as the world's JSON view (read-only)."""
        if table not in self._views:
            self._views[table] = self.world.records(self.db, table)
        return self._views[table]

    def record(self, table: str, key: str) -> dict[str, Any] | None:
        return self.records(table).get(key)

    def read_before_write(self, order_id: str, readers: tuple[str, ...] = ("get_order_details",)) -> bool:
        """The order was read successfully before the first attempt to change it (or at all, if never changed)."""
        writes = self.world.write_tools
        for c in self.calls:
            args = c["arguments"] if isinstance(c["arguments"], dict) else {}
            if args.get("order_id") != order_id:
                continue
            if c["name"] in writes:
                return False
            if c["name"] in readers and c["ok"]:
                return True
        return False

    def write_attempts(self, order_id: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self.calls
            if c["name"] in self.world.write_tools
            and isinstance(c["arguments"], dict)
            and c["arguments"].get("order_id") == order_id
        ]

    def changed(self, table: str) -> set[str]:
        """Keys of `table` ('users' or 'orders') whose record differs from the episode's initial state."""
        now, before = self.records(table), self.initial[table]
        return {k for k in set(now) | set(before) if now.get(k) != before.get(k)}

    def matches_target(self, table: str, key: str) -> bool:
        return self.records(table).get(key) == self._target[table].get(key)

    def communicate(self) -> tuple[float, list[str], list[str]]:
        """(share of required facts told to the user, 0 if any forbidden fact was told; missing; wrong)."""
        sc = self._require()
        missing = [f for f in sc.required_facts if not fact_communicated(f, self.agent_messages)]
        wrong = [f for f in sc.forbidden_facts if fact_communicated(f, self.agent_messages)]
        n = len(sc.required_facts)
        score = 1.0 if not n else (n - len(missing)) / n
        return (0.0 if wrong else score), missing, wrong

    def verify(self) -> RewardBreakdown:
        self._require()
        comps, details = self.grade()
        reward = sum(self.WEIGHTS[k] * comps[k] for k in self.WEIGHTS)
        success = all(comps[k] >= 1.0 - 1e-9 for k in self.WEIGHTS)
        if self._target_digest is not None:  # the world's own check: the whole state equals the gold one
            comps = {**comps, "db_hash": float(self.world.digest(self.db) == self._target_digest)}
            success = success and comps["db_hash"] == 1.0
        reward = 1.0 if success else min(round(reward, 6), 0.999999)
        return RewardBreakdown(
            reward=reward,
            success=success,
            components={k: float(v) for k, v in comps.items()},
            details={**details, "termination": self.termination, "turns": self.turns},
        )

    def task_metadata(self) -> dict[str, Any]:
        sc = self._require()
        meta = {
            "task_id": self.task_id,
            "family": self.capability,
            "variant": sc.variant,
            "capability": self.capability,
            "required_capabilities": [self.capability],
            "params": self.params,
            "answer_values": list(sc.answers),
            "required_facts": list(sc.required_facts),
            "forbidden_facts": list(sc.forbidden_facts),
            "reference_actions": self.reference_actions(),
        }
        if self.world.name != "shop":
            meta["world"] = self.world.name
        return meta
