"""The world seam: what a capability template needs from the target's world, as one small protocol (`World`).

A template (`envs.synthetic`) draws a task from a seeded generator and grades the episode's final state; the world
supplies everything the agent touches and everything grading reads:

  name, policy          the world's name and the system prompt text its agents are given (the target's policy)
  schemas               every tool of the world (OpenAI format, the world's order); `write_tools`: the mutating ones
  aliases               a template's tool the world lacks -> the world's way of doing the same (τ²-retail has no
                        `list_user_orders`: order ids come from `get_user_details`); `translate(action)` applies it
                        and `tool_for(name)` raises for a tool with no counterpart (never a silent fallback)
  builder(rng)          a seeded generator of small valid worlds (`generator.WorldBuilder` or a subclass: the draws
                        the templates make through `tasks.customer` and friends)
  load(db) -> state     the world's own database from a generated one (τ²: a `RetailDB`, validated by τ²'s model)
  copy / session        a private copy of a state; the world's tools on a state (`session(state).call(name, args)`
                        -> (observation text, error)): the world's own outputs, errors and status rules
  records(state, table) field accessors: a JSON view of the `users` / `orders` records the templates grade
  refund_method(order)  where a return's refund goes (the field differs between worlds)
  digest(state)         a digest of the whole state (τ²: its DB hash); with `grades_digest` success also needs
                        the digest of the gold state (the reference actions replayed)
  identity()            what an artifact records (name, and for a packaged world its data fingerprint)

Worlds are named in `WORLDS` (lazy "module:attr" strings, so no import edge points at a world's package) and a
target picks its world by name (`world_for_target`): `shop` for the built-in shop and anything else, `tau2-retail`
for τ²-bench's retail domain. Adding a world (airline, a user's own tools) is one module implementing `World` and
one line here; see ARCHITECTURE.md, "Adding a target world".
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
from typing import Any, ClassVar

from trace_cli.envs.worlds.generator import WorldBuilder
from trace_cli.errors import UsageError

WORLDS: dict[str, str] = {
    "shop": "trace_cli.envs.shop.synthesis:ShopWorld",
    "tau2-retail": "trace_cli.envs.tau2.world:Tau2RetailWorld",
}
DEFAULT = "shop"
TABLES = ("users", "orders")


class World:
    """Base class of the worlds (see the module docstring for the protocol); defaults for the optional parts."""

    name: ClassVar[str] = ""
    aliases: ClassVar[dict[str, str]] = {}
    features: ClassVar[frozenset[str]] = frozenset()  # what its data model has, e.g. "order_dates"
    fallback: ClassVar[bool] = False  # a tool the target lacks may use the world's own schema (shop only)
    validates: ClassVar[bool] = True  # trace checks arguments against the schema before the call (else the
    # world's toolkit answers every call itself, with its own errors)
    grades_digest: ClassVar[bool] = False

    policy: str
    schemas: dict[str, dict[str, Any]]
    write_tools: frozenset[str]

    # -- tools -----------------------------------------------------------------------------------------------
    def tool_for(self, name: str) -> str:
        """The world's tool for a template's tool `name` (itself, or its alias); UsageError when it has none."""
        if name in self.schemas:
            return name
        if name in self.aliases:
            return self.aliases[name]
        raise UsageError(
            f"world {self.name!r} has no tool {name!r} and no way to do what it does; "
            f"its tools: {', '.join(self.schemas)}"
        )

    def translate(self, action: dict[str, Any]) -> dict[str, Any]:
        """A template's action in the world's terms: a tool call through its alias (with the arguments the
        world's tool takes); messages and the world's own tools unchanged (the same object)."""
        name = action.get("name")
        if name is None or name in self.schemas:
            return action
        tool = self.tool_for(name)
        accepted, _ = self.parameters(tool)
        return {"name": tool, "arguments": {k: v for k, v in action["arguments"].items() if k in accepted}}

    def implementation(self, name: str) -> Any:  # pragma: no cover - abstract
        """The function implementing tool `name` (its signature names the arguments the tool takes)."""
        raise NotImplementedError

    @functools.cache  # noqa: B019 - worlds are process-wide singletons (get_world)
    def parameters(self, name: str) -> tuple[frozenset[str], frozenset[str]]:
        """(all, required) argument names of the implementation of tool `name`."""
        sig = inspect.signature(self.implementation(name))
        ps = [p for k, p in sig.parameters.items() if k != "self"]
        return (
            frozenset(p.name for p in ps),
            frozenset(p.name for p in ps if p.default is inspect.Parameter.empty),
        )

    def has(self, feature: str) -> bool:
        return feature in self.features

    # -- state -----------------------------------------------------------------------------------------------
    def builder(self, rng: random.Random) -> WorldBuilder:
        return WorldBuilder(rng)

    def load(self, db: dict[str, Any]) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def copy(self, state: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def session(self, state: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def records(self, state: Any, table: str) -> dict[str, dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def refund_method(self, order: dict[str, Any]) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def digest(self, state: Any) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        return {"name": self.name}


@functools.cache
def get_world(name: str) -> World:
    """The world `name` (one instance per process); UsageError for an unknown name or a missing package."""
    if isinstance(name, World):
        return name
    if name not in WORLDS:
        raise UsageError(f"unknown world {name!r}; worlds: {', '.join(WORLDS)}")
    module, attr = WORLDS[name].split(":")
    return getattr(importlib.import_module(module), attr)()


def world_for_target(ref: Any) -> str:
    """The world a target environment's synthesized tasks live in: the world of that name (`tau2-retail`,
    also `tau2:retail` and with `?params`), else the shop. A τ²-bench domain without a world of its own
    (`tau2-airline`, `tau2-telecom`) is an error: its tasks on the shop's database would be a silent fallback."""
    name = ref.split("?", 1)[0].replace("tau2:", "tau2-", 1) if isinstance(ref, str) else None
    if isinstance(ref, dict):
        name = ref.get("name")
    if name in WORLDS:
        return name
    if isinstance(name, str) and name.startswith("tau2-"):
        raise UsageError(
            f"no synthesis world for target {name!r} yet (worlds: {', '.join(WORLDS)}); adding one is one module "
            "(ARCHITECTURE.md, 'Adding a target world')"
        )
    return DEFAULT


__all__ = ["DEFAULT", "TABLES", "WORLDS", "World", "get_world", "world_for_target"]
