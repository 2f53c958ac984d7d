"""The τ²-retail world behind the seam (`trace_cli.envs.worlds.World`): synthetic tasks on τ²-bench's own retail
data model, tools and policy.

- **Database**: a small world drawn by the retail generator (`worlds.generator.WorldBuilder`, the draws the
  templates make) with τ²'s product types (names, option dimensions and price ranges of the 50 products of τ²'s
  catalogue, fresh item and product ids), then `load`ed into a `RetailDB` with every field τ²'s model has (the
  order's shipping address, fulfillments with tracking ids for processed/delivered orders, the payment history,
  payment-method ids, cancel reasons), validated by τ²'s pydantic model. Synthetic by construction: no user id,
  e-mail, order id, product id, item id or payment-method id of τ²'s real database (the one its evaluation tasks
  run on) is ever drawn (`RESERVED`).
- **Tools**: τ²'s `Environment.get_response` on that database, so observations are τ²'s tool outputs and error
  texts exactly ("Error: Non-pending order cannot be cancelled", full order records as JSON); every one of τ²'s 15
  tools is offered. τ² has no `list_user_orders`: the templates' order listing goes through `get_user_details`
  (`aliases`), which lists the user's order ids.
- **Policy**: τ²'s agent system prompt (its instruction and the retail policy), as the `tau2-retail` environment
  gives it.
- **Grading**: τ²'s DB hash (`get_dict_hash(db.model_dump())`) of the final state against the gold state (the
  scenario's reference actions replayed), plus each template's own components (`grades_digest`).
- τ²'s orders have no dates, so a template's "most recent order" requests are not posed here
  (`features` lacks "order_dates").
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import random
from typing import Any, ClassVar

from trace_cli.envs.tau2.package import domain, tau2
from trace_cli.envs.worlds import World
from trace_cli.envs.worlds.generator import CANCEL_REASONS, WorldBuilder, money, order_total

VERSION = 1  # of the generator below: a change to its draws changes every τ²-retail synthetic task


@functools.cache
def catalogue() -> list[tuple[str, dict[str, list[str]], tuple[float, float]]]:
    """τ²'s product types: (name, option dimension -> values, (lowest, highest) variant price), by name."""
    out = []
    for p in sorted(domain("retail").pristine.products.values(), key=lambda p: p.name):
        dims: dict[str, set[str]] = {}
        for v in p.variants.values():
            for k, x in v.options.items():
                dims.setdefault(k, set()).add(x)
        prices = [v.price for v in p.variants.values()]
        out.append((p.name, {k: sorted(v) for k, v in dims.items()}, (min(prices), max(prices))))
    return out


@functools.cache
def reserved() -> tuple[frozenset[str], frozenset[str]]:
    """(ids, e-mails) of τ²'s real retail database: never drawn into a synthetic world."""
    db = domain("retail").pristine
    ids: set[str] = set(db.users) | set(db.orders) | set(db.products)
    for p in db.products.values():
        ids |= set(p.variants)
    for u in db.users.values():
        ids |= set(u.payment_methods)
    return frozenset(ids), frozenset(u.email.lower() for u in db.users.values())


class Tau2RetailBuilder(WorldBuilder):
    """The retail generator with τ²'s product types and none of τ²'s real ids or e-mails."""

    def __init__(self, rng: random.Random):
        super().__init__(rng)
        ids, self._emails = reserved()
        self.used |= ids  # `_unique` redraws any of them

    def add_products(self, n: int) -> None:
        for name, dims, (lo, hi) in self.rng.sample(catalogue(), n):
            pid = self.digits(10)
            n_variants = 3 if self.rng.random() < 0.7 else 4
            seen: list[dict[str, str]] = []
            while len(seen) < n_variants:
                options = {k: self.rng.choice(v) for k, v in dims.items()}
                if options not in seen:
                    seen.append(options)
            variants = {}
            for options in seen:
                iid = self.digits(10)
                variants[iid] = {
                    "item_id": iid,
                    "options": options,
                    "price": money(self.rng.uniform(lo * 0.97, hi * 1.03)),
                    "available": self.rng.random() < 0.8,
                }
            self.db["products"][pid] = {"product_id": pid, "name": name, "variants": variants}

    def add_user(self, first: str | None = None, last: str | None = None) -> dict[str, Any]:
        user = super().add_user(first, last)
        while user["email"].lower() in self._emails:
            n = user["name"]
            user["email"] = (
                f"{n['first_name'].lower()}.{n['last_name'].lower()}{self.rng.randint(10, 9999)}@example.com"
            )
        return user


def _number(text: str, digits: int) -> str:
    """A deterministic string of `digits` digits from `text` (tracking ids: no random draw)."""
    return str(int(hashlib.sha256(text.encode()).hexdigest(), 16))[:digits]


class Tau2Session:
    """τ²'s own `Environment` on one state: every call answered by `get_response` (outputs and errors τ²'s)."""

    def __init__(self, env: Any, names: frozenset[str]):
        self.env = env
        self.names = names
        self.n = 0

    def call(self, name: Any, args: Any) -> tuple[str, bool]:
        from tau2.data_model.message import ToolCall

        self.n += 1
        if isinstance(args, str):
            import json

            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = None
        if not isinstance(args, dict):
            return f"Error: {name}: arguments must be a JSON object", True
        if name not in self.names:
            return f"Error: Tool '{name}' not found.", True
        msg = self.env.get_response(ToolCall(id=f"call_{self.n}", name=str(name), arguments=args))
        return msg.content or "", bool(msg.error)


class Tau2RetailWorld(World):
    name = "tau2-retail"
    aliases: ClassVar[dict[str, str]] = {"list_user_orders": "get_user_details"}
    features: ClassVar[frozenset[str]] = frozenset()  # no order dates in τ²'s data model
    fallback = False
    validates = False  # τ²'s toolkit answers every call, with its own errors
    grades_digest = True

    def __init__(self) -> None:
        tau2()
        self.domain = domain("retail")
        self.schemas = {t["function"]["name"]: t for t in self.domain.tools}
        self._tools_cls = importlib.import_module("tau2.domains.retail.tools").RetailTools
        toolkit = importlib.import_module("tau2.environment.toolkit")
        self.write_tools = frozenset(
            n
            for n in self.schemas
            if getattr(getattr(self._tools_cls, n), toolkit.TOOL_TYPE_ATTR) == toolkit.ToolType.WRITE
        )
        self._hash = importlib.import_module("tau2.utils.utils").get_dict_hash
        try:
            from trace_cli.envs.tau2.grading import agent_system_prompt

            self.policy = agent_system_prompt(self.domain)
        except ImportError:  # pragma: no cover - the evaluation environment's module not there
            self.policy = self.domain.policy

    def implementation(self, name: str) -> Any:
        return getattr(self._tools_cls, name)

    def builder(self, rng: random.Random) -> WorldBuilder:
        return Tau2RetailBuilder(rng)

    def load(self, db: dict[str, Any]) -> Any:
        """The generated world as a `RetailDB` (τ²'s model validates every field)."""
        users: dict[str, Any] = {}
        for uid, u in db["users"].items():
            users[uid] = {
                "user_id": uid,
                "name": dict(u["name"]),
                "address": dict(u["address"]),
                "email": u["email"],
                "payment_methods": {pm: {**m, "id": pm} for pm, m in u["payment_methods"].items()},
                "orders": list(u["orders"]),
            }
        orders: dict[str, Any] = {}
        for oid, o in db["orders"].items():
            total, pm = order_total(o), o["payment_method_id"]
            history = [{"transaction_type": "payment", "amount": total, "payment_method_id": pm}]
            extra: dict[str, Any] = {}
            if o["status"] == "cancelled":
                history.append({"transaction_type": "refund", "amount": total, "payment_method_id": pm})
                extra["cancel_reason"] = CANCEL_REASONS[int(_number(oid, 6)) % 2]
            shipped = o["status"] in ("processed", "delivered")
            orders[oid] = {
                "order_id": oid,
                "user_id": o["user_id"],
                "address": dict(db["users"][o["user_id"]]["address"]),
                "items": [
                    {k: line[k] for k in ("name", "product_id", "item_id", "price", "options")}
                    for line in o["items"]
                ],
                "status": o["status"],
                "fulfillments": [
                    {
                        "tracking_id": [_number(f"tracking:{oid}", 12)],
                        "item_ids": [x["item_id"] for x in o["items"]],
                    }
                ]
                if shipped
                else [],
                "payment_history": history,
                **extra,
            }
        products = {
            pid: {
                "name": p["name"],
                "product_id": pid,
                "variants": {
                    iid: {k: v[k] for k in ("item_id", "options", "available", "price")}
                    for iid, v in p["variants"].items()
                },
            }
            for pid, p in db["products"].items()
        }
        return self.domain.db_class.model_validate({"products": products, "users": users, "orders": orders})

    def copy(self, state: Any) -> Any:
        return state.model_copy(deep=True)

    def environment(self, state: Any) -> Any:
        """τ²'s own `Environment` (the retail domain's `get_environment`) on `state`."""
        return self.domain.environment(state)

    def session(self, state: Any) -> Tau2Session:
        return Tau2Session(self.environment(state), frozenset(self.schemas))

    def records(self, state: Any, table: str) -> dict[str, dict[str, Any]]:
        return {k: v.model_dump() for k, v in getattr(state, table).items()}

    def refund_method(self, order: dict[str, Any]) -> str | None:
        return order.get("return_payment_method_id")

    def digest(self, state: Any) -> str:
        return self._hash(state.model_dump())

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "generator": VERSION, "tau2": dict(self.domain.fingerprint)}
