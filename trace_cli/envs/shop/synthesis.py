"""The shop as a world behind the seam (`trace_cli.envs.worlds.World`): its tools, policy and dict database.

The state is the generated database itself (a JSON-like dict): products are shared, users and orders copied per
episode; `records` are the live tables, so grading reads exactly what the shop's tools wrote. The generator is
the plain `WorldBuilder`, whose draws the committed tasks and models depend on.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, ClassVar

from trace_cli.envs.shop.env import POLICY
from trace_cli.envs.shop.tools import TOOL_SCHEMAS, WRITE_TOOLS, ShopTools, ToolError
from trace_cli.envs.worlds import World
from trace_cli.envs.worlds.facts import clone


class ShopSession:
    """The shop's tools on one state: (observation, error); a refused call is 'Error: ...'."""

    def __init__(self, db: dict[str, Any]):
        self.api = ShopTools(db)

    def call(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        try:
            return self.api.call(name, copy.deepcopy(args)), False
        except ToolError as exc:
            return f"Error: {exc}", True


class ShopWorld(World):
    name = "shop"
    features: ClassVar[frozenset[str]] = frozenset({"order_dates"})
    fallback = True  # recovered target schemas may lack a tool: the shop's own schema stands in
    validates = True

    def __init__(self) -> None:
        self.policy = POLICY
        self.schemas = TOOL_SCHEMAS
        self.write_tools = WRITE_TOOLS

    def implementation(self, name: str) -> Any:
        return getattr(ShopTools, name)

    def load(self, db: dict[str, Any]) -> dict[str, Any]:
        return {"products": db["products"], "users": clone(db["users"]), "orders": clone(db["orders"])}

    def copy(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "products": state["products"],
            "users": clone(state["users"]),
            "orders": clone(state["orders"]),
        }

    def session(self, state: dict[str, Any]) -> ShopSession:
        return ShopSession(state)

    def records(self, state: dict[str, Any], table: str) -> dict[str, dict[str, Any]]:
        return state[table]

    def refund_method(self, order: dict[str, Any]) -> str | None:
        return (order.get("refund") or {}).get("payment_method_id")

    def digest(self, state: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()
