"""Template `tool_calling_precision`: one write call whose arguments must be exactly right.

Two kinds: an address change written out in prose ("12 Elm Street, Apt 4B, Boston, MA 02139, USA") that
must be split into the schema's fields verbatim (zip kept as a string with its leading zero, address2 kept
separate), and an exchange of 1-3 items of a delivered order for other variants (item ids copied exactly
from `get_order_details` / `get_product_details`, as arrays of strings, order id with its '#').
`trap_fraction` is the probability of the harder format (leading-zero zip and an address2; several items).

Reward = fraction of the written fields that end exactly as the reference leaves them (0 without a write);
success = all of them.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, scenario
from trace_cli.envs.worlds.generator import money
from trace_cli.envs.worlds.tasks import (
    AUTH_TOOLS,
    Customer,
    address_change,
    call,
    describe,
    lines_of_other_products,
    new_address,
    say,
)

KINDS = ("address", "exchange")
ADDRESS_FIELDS = ("address1", "address2", "city", "state", "country", "zip")
EXCHANGE_FIELDS = ("status", "exchange_items", "exchange_new_items", "exchange_payment_method_id")


class ToolCallingPrecision(SyntheticEnv):
    capability = "tool_calling_precision"
    description = "A single write call (address change or item exchange) whose arguments must be exact."
    TOOLS = (
        *AUTH_TOOLS,
        "get_order_details",
        "get_product_details",
        "modify_user_address",
        "exchange_delivered_order_items",
    )
    KNOBS = {
        "kinds": Knob(list, choices=KINDS, doc="task kinds"),
        "trap_fraction": Knob(
            float,
            0.0,
            1.0,
            doc="probability of the harder format (leading-zero zip + address2; several exchanged items)",
        ),
        "max_items": Knob(int, 1, 3, doc="most items exchanged at once (when trapped)"),
        "n_orders": Knob(int, 2, 10, doc="orders of the customer"),
    }
    LEVELS = [
        {"kinds": ["address"], "trap_fraction": 0.2, "max_items": 1, "n_orders": 3},
        {"kinds": list(KINDS), "trap_fraction": 0.4, "max_items": 1, "n_orders": 4},
        {"kinds": list(KINDS), "trap_fraction": 0.6, "max_items": 2, "n_orders": 5},
        {"kinds": list(KINDS), "trap_fraction": 0.8, "max_items": 2, "n_orders": 5},
        {"kinds": list(KINDS), "trap_fraction": 1.0, "max_items": 2, "n_orders": 6},
        {"kinds": list(KINDS), "trap_fraction": 1.0, "max_items": 3, "n_orders": 8},
    ]
    WEIGHTS = {"fields": 1.0}

    @classmethod
    def shape(cls, profile: dict[str, Any]) -> dict[str, Any]:
        """The task kinds (address changes, exchanges) the LACKING conversations wrote."""
        kinds = [k for k in KINDS if profile["kinds"].get(k)]
        return {"kinds": kinds} if kinds else {}

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        c = self.customer(rng, k["n_orders"])
        b, uid = c.b, c.user["user_id"]
        kind = rng.choice(k["kinds"])
        trap = rng.random() < k["trap_fraction"]
        if kind == "address":
            a = new_address(b, c.user, leading_zero=trap, address2=trap)
            request, reference = address_change(rng, c.auth, uid, a)
            variant = "address_trap" if trap else "address"
            return scenario(
                c, request, reference, [uid], variant=variant, data={"kind": "address", "key": uid}
            )
        return self._exchange(rng, c, trap)

    def _exchange(self, rng: random.Random, c: Customer, trap: bool) -> Scenario:
        """Exchange 1 item (2 to max_items when trapped) of a delivered order for other variants."""
        k, b, uid, orders = self.knobs, c.b, c.user["user_id"], c.orders
        order = rng.choice(orders)
        order["status"] = "delivered"
        n = rng.randint(2, k["max_items"]) if trap and k["max_items"] > 1 else 1
        if len(order["items"]) < n:
            have = {x["product_id"] for x in order["items"]}
            order["items"] += lines_of_other_products(b, n - len(order["items"]), have)
        lines = rng.sample(order["items"], n)
        lines.sort(key=order["items"].index)
        news, parts, diff = [], [], 0.0
        for line in lines:
            variants = b.db["products"][line["product_id"]]["variants"]
            new = rng.choice([v for iid, v in variants.items() if iid != line["item_id"]])
            new["available"] = True  # the requested variant can be exchanged to
            news.append(new)
            diff += new["price"] - line["price"]
            parts.append(
                f"the {line['name']} ({describe(line['options'])}) for the one with {describe(new['options'])}"
            )
        oid = order["order_id"]
        request = (
            f"In my order {oid} I'd like to exchange "
            + " and ".join(parts)
            + ". Use the original payment method."
        )
        reads = [call("get_order_details", order_id=oid)]
        reads += [
            call("get_product_details", product_id=pid)
            for pid in dict.fromkeys(x["product_id"] for x in lines)
        ]
        write = call(
            "exchange_delivered_order_items",
            order_id=oid,
            item_ids=[x["item_id"] for x in lines],
            new_item_ids=[v["item_id"] for v in news],
            payment_method_id=order["payment_method_id"],
        )
        reference = [
            c.auth,
            *reads,
            write,
            say(
                f"The exchange in order {oid} is requested; the price difference is {money(diff):.2f} dollars."
            ),
        ]
        answers = [uid] + [x["item_id"] for x in lines] + [v["item_id"] for v in news]
        return scenario(
            c, request, reference, answers, variant=f"exchange_{n}", data={"kind": "exchange", "key": oid}
        )

    def grade(self) -> tuple[dict[str, float], dict[str, Any]]:
        d = self._scenario.data
        if d["kind"] == "address":
            table, fields = "users", ADDRESS_FIELDS
            now = self.record("users", d["key"])["address"]
            want = self._target["users"][d["key"]]["address"]
        else:
            table, fields = "orders", EXCHANGE_FIELDS
            now, want = self.record("orders", d["key"]), self._target["orders"][d["key"]]
        if d["key"] not in self.changed(table):
            return {"fields": 0.0}, {"written": False}
        right = [f for f in fields if now.get(f) == want.get(f)]
        frac = len(right) / len(fields)
        other = (self.changed("users") | self.changed("orders")) - {d["key"]}
        if other:
            frac *= 0.5
        return {"fields": frac}, {
            "written": True,
            "wrong_fields": [f for f in fields if f not in right],
            "collateral": sorted(other),
        }
