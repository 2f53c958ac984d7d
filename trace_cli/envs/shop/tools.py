"""The shop's tools: canonical OpenAI-format schemas (τ²-bench retail names) and their database effects.

Every tool returns compact JSON text (or a bare id); failures raise `ToolError`, which the environment
turns into an "Error: ..." observation. The database itself enforces identity (a user's data can only be
touched after that user was found through an authentication tool, and only one user per conversation)
and the status rules (cancel only pending, return/exchange only delivered), like τ²-bench does.
"""

from __future__ import annotations

import json
from typing import Any

from trace_cli.envs.base import tool_schema
from trace_cli.envs.worlds.generator import CANCEL_REASONS, money, order_total

_S = {"type": "string"}
_IDS = {"type": "array", "items": {"type": "string"}, "minItems": 1}


def _tool(name: str, description: str, **arguments: Any) -> dict[str, Any]:
    """A shop tool's schema: every shop tool requires all of its arguments."""
    return tool_schema(name, description, arguments, list(arguments))


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    s["function"]["name"]: s
    for s in [
        _tool("find_user_id_by_email", "Find a user id by email.", email=_S),
        _tool(
            "find_user_id_by_name_zip",
            "Find a user id by first name, last name and zip code.",
            first_name=_S,
            last_name=_S,
            zip=_S,
        ),
        _tool("get_user_details", "Get a user's profile: address, payment methods, order ids.", user_id=_S),
        _tool("list_user_orders", "List a user's orders with date and status.", user_id=_S),
        _tool(
            "get_order_details",
            "Get an order's status, items, total and payment method.",
            order_id={"type": "string", "description": "e.g. '#W0000000'"},
        ),
        _tool(
            "get_product_details",
            "Get a product's variants (item ids, options, price, availability).",
            product_id=_S,
        ),
        _tool(
            "cancel_pending_order",
            "Cancel a pending order; the total is refunded to its payment method.",
            order_id=_S,
            reason={"type": "string", "enum": CANCEL_REASONS},
        ),
        _tool(
            "return_delivered_order_items",
            "Return items of a delivered order for a refund.",
            order_id=_S,
            item_ids=_IDS,
            payment_method_id=_S,
        ),
        _tool(
            "exchange_delivered_order_items",
            "Exchange items of a delivered order for other variants of the same products.",
            order_id=_S,
            item_ids=_IDS,
            new_item_ids=_IDS,
            payment_method_id=_S,
        ),
        _tool(
            "modify_user_address",
            "Change a user's default address.",
            **dict.fromkeys(("user_id", "address1", "address2", "city", "state", "country", "zip"), _S),
        ),
        _tool("transfer_to_human_agents", "Transfer the user to a human agent, with a summary.", summary=_S),
    ]
}

WRITE_TOOLS = frozenset(
    {
        "cancel_pending_order",
        "return_delivered_order_items",
        "exchange_delivered_order_items",
        "modify_user_address",
    }
)


class ToolError(Exception):
    """A tool call the database refuses; the message becomes the observation after 'Error: '."""


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class ShopTools:
    """Tool implementations over one episode's database. `authenticated` is the user found so far."""

    def __init__(self, db: dict[str, Any]):
        self.db = db
        self.authenticated: str | None = None
        self.transferred = False

    def call(self, name: str, args: dict[str, Any]) -> str:
        return getattr(self, name)(**args)

    # -- identity ----------------------------------------------------------------------------------
    def _login(self, user_id: str) -> str:
        if self.authenticated not in (None, user_id):
            raise ToolError("this conversation is already with another user; only one user can be helped")
        self.authenticated = user_id
        return user_id

    def _require_login(self) -> None:
        # Checked before any lookup, so an unauthenticated agent cannot even probe which ids exist.
        if self.authenticated is None:
            raise ToolError("authenticate the user first (by email, or by name and zip)")

    def _owned(self, table: str, key: str, what: str) -> dict[str, Any]:
        """A user or order record of the authenticated user (users and orders both carry `user_id`)."""
        self._require_login()
        record = self.db[table].get(key)
        if record is None:
            raise ToolError(f"{what} not found")
        if self.authenticated != record["user_id"]:
            raise ToolError("this data belongs to a different user than the one authenticated")
        return record

    def _user(self, user_id: str) -> dict[str, Any]:
        return self._owned("users", user_id, "user")

    def _order(self, order_id: str) -> dict[str, Any]:
        return self._owned("orders", order_id, "order")

    def find_user_id_by_email(self, email: str) -> str:
        for uid, user in self.db["users"].items():
            if user["email"].lower() == email.strip().lower():
                return self._login(uid)
        raise ToolError("user not found")

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002
        for uid, user in self.db["users"].items():
            n = user["name"]
            if (n["first_name"].lower(), n["last_name"].lower(), user["address"]["zip"]) == (
                first_name.strip().lower(),
                last_name.strip().lower(),
                zip.strip(),
            ):
                return self._login(uid)
        raise ToolError("user not found")

    # -- reads -------------------------------------------------------------------------------------
    @staticmethod
    def _describe_method(m: dict[str, Any]) -> str:
        if m["source"] == "credit_card":
            return f"{m['brand']} {m['last_four']}"
        if m["source"] == "gift_card":
            return f"gift card, balance {m['balance']:.2f}"
        return "paypal"

    def get_user_details(self, user_id: str) -> str:
        u = self._user(user_id)
        return dumps(
            {
                "user_id": u["user_id"],
                "name": f"{u['name']['first_name']} {u['name']['last_name']}",
                "email": u["email"],
                "address": u["address"],
                "payment_methods": {pm: self._describe_method(m) for pm, m in u["payment_methods"].items()},
                "orders": u["orders"],
            }
        )

    def list_user_orders(self, user_id: str) -> str:
        u = self._user(user_id)
        rows = []
        for oid in u["orders"]:
            o = self.db["orders"][oid]
            rows.append({"order_id": oid, "date": o["date"], "status": o["status"]})
        return dumps(rows)

    def _order_view(self, o: dict[str, Any]) -> str:
        view = {
            "order_id": o["order_id"],
            "date": o["date"],
            "status": o["status"],
            "items": [
                {k: line[k] for k in ("item_id", "product_id", "name", "options", "price")}
                for line in o["items"]
            ],
            "total": order_total(o),
            "payment_method_id": o["payment_method_id"],
        }
        for key in (
            "cancel_reason",
            "refund",
            "return_items",
            "exchange_items",
            "exchange_new_items",
            "price_difference",
            "exchange_payment_method_id",
        ):
            if key in o:
                view[key] = o[key]
        return dumps(view)

    @staticmethod
    def _write_view(o: dict[str, Any], *keys: str) -> str:
        # Writes answer with what changed, not the whole order: shorter transcripts for small models.
        return dumps({"order_id": o["order_id"], "status": o["status"], **{k: o[k] for k in keys}})

    def get_order_details(self, order_id: str) -> str:
        return self._order_view(self._order(order_id))

    def get_product_details(self, product_id: str) -> str:
        p = self.db["products"].get(product_id)
        if p is None:
            raise ToolError("product not found")
        return dumps(
            {
                "product_id": p["product_id"],
                "name": p["name"],
                "variants": [
                    {
                        "item_id": v["item_id"],
                        "options": v["options"],
                        "price": v["price"],
                        "available": v["available"],
                    }
                    for v in p["variants"].values()
                ],
            }
        )

    # -- writes ------------------------------------------------------------------------------------
    def _payment_method(self, order: dict[str, Any], payment_method_id: str) -> dict[str, Any]:
        methods = self.db["users"][order["user_id"]]["payment_methods"]
        if payment_method_id not in methods:
            raise ToolError("payment method not found")
        return methods[payment_method_id]

    def _lines(self, order: dict[str, Any], item_ids: list[str]) -> list[dict[str, Any]]:
        if len(set(item_ids)) != len(item_ids):
            raise ToolError("duplicate item ids")
        by_id = {line["item_id"]: line for line in order["items"]}
        missing = [i for i in item_ids if i not in by_id]
        if missing:
            raise ToolError(f"item {missing[0]} is not in order {order['order_id']}")
        return [by_id[i] for i in item_ids]

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        o = self._order(order_id)
        if o["status"] != "pending":
            # Deliberately does not say which status: an agent learns it only by reading the order.
            raise ToolError("non-pending order cannot be cancelled")
        o["status"] = "cancelled"
        o["cancel_reason"] = reason
        o["refund"] = {"amount": order_total(o), "payment_method_id": o["payment_method_id"]}
        return self._write_view(o, "cancel_reason", "refund")

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        o = self._order(order_id)
        if o["status"] != "delivered":
            raise ToolError("non-delivered order cannot be returned")
        lines = self._lines(o, item_ids)
        method = self._payment_method(o, payment_method_id)
        if payment_method_id != o["payment_method_id"] and method["source"] != "gift_card":
            raise ToolError("refund must go to the original payment method or a gift card")
        o["status"] = "return requested"
        o["return_items"] = sorted(item_ids)
        o["refund"] = {
            "amount": money(sum(line["price"] for line in lines)),
            "payment_method_id": payment_method_id,
        }
        return self._write_view(o, "return_items", "refund")

    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        o = self._order(order_id)
        if o["status"] != "delivered":
            raise ToolError("non-delivered order cannot be exchanged")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("item_ids and new_item_ids must have the same length")
        lines = self._lines(o, item_ids)
        diff = 0.0
        for line, new_id in zip(lines, new_item_ids, strict=True):
            variants = self.db["products"][line["product_id"]]["variants"]
            if new_id not in variants:
                raise ToolError(f"new item {new_id} is not a variant of product {line['product_id']}")
            if new_id == line["item_id"]:
                raise ToolError(f"new item {new_id} is the same as the old one")
            if not variants[new_id]["available"]:
                raise ToolError(f"new item {new_id} is not available")
            diff += variants[new_id]["price"] - line["price"]
        method = self._payment_method(o, payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff:
            raise ToolError("insufficient gift card balance to pay the price difference")
        o["status"] = "exchange requested"
        o["exchange_items"] = sorted(item_ids)
        o["exchange_new_items"] = sorted(new_item_ids)
        o["price_difference"] = money(diff)
        o["exchange_payment_method_id"] = payment_method_id
        return self._write_view(
            o, "exchange_items", "exchange_new_items", "price_difference", "exchange_payment_method_id"
        )

    def modify_user_address(
        self, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> str:  # noqa: A002
        u = self._user(user_id)
        u["address"] = {
            "address1": address1,
            "address2": address2,
            "city": city,
            "state": state,
            "country": country,
            "zip": zip,
        }
        return dumps({"user_id": user_id, "address": u["address"]})

    def transfer_to_human_agents(self, summary: str) -> str:
        self.transferred = True
        return "Transfer successful"
