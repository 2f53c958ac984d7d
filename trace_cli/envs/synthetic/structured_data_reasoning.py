"""Template `structured_data_reasoning`: pick the right record out of tool output full of distractors.

The user wants to return one item, described by a property the agent must work out from the data: the most
expensive / cheapest item of an order, the variant with a given option, or a product from the most recent
*delivered* order (newer undelivered and older delivered orders hold the same product). The item id, the
order (for "most recent") and the refund amount are never in the request. A fifth kind, `by_name` (the item
named by its product, among other products: its id only in the order's details, a lookup before the write), is
in no level: it is posed only when the diagnosis's LACKING conversations asked that way (`shape`; issue 44's
planted "lookup" skill), so the levels' draws stay as they were.

Reward = 0.2·order + 0.2·item + 0.2·payment + 0.4·communicate: the return targets the right order (and no
other order changed), the right item, the right refund method; the refund amount is told to the user.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, scenario
from trace_cli.envs.synthetic.shaping import clamp
from trace_cli.envs.worlds.tasks import (
    AUTH_TOOLS,
    call,
    gift_card,
    lines_of_other_products,
    most_recent_delivered,
    priced_lines,
    say,
)

KINDS = ("most_expensive", "cheapest", "by_option", "most_recent")  # the levels' kinds (`list(KINDS)`: keep)
SHAPED_KINDS = ("by_name",)  # only by a pin from the diagnosis (`shape`), never a level's


class StructuredDataReasoning(SyntheticEnv):
    capability = "structured_data_reasoning"
    description = (
        "Return the item the user describes by a property (most expensive, cheapest, an option, most "
        "recent delivered order) among distractor orders, items and variants."
    )
    TOOLS = (
        *AUTH_TOOLS,
        "list_user_orders",
        "get_order_details",
        "get_user_details",
        "return_delivered_order_items",
    )
    KNOBS = {
        "n_orders": Knob(int, 3, 10, doc="orders of the customer"),
        "n_items": Knob(int, 2, 5, doc="items in the order the answer is in (distractor items)"),
        "kinds": Knob(list, choices=KINDS + SHAPED_KINDS, doc="how the item is described"),
        "gift_card_fraction": Knob(float, 0.0, 1.0, doc="probability that the refund goes to a gift card"),
    }
    # The easiest level: two records to choose between, one way of describing the item.
    LEVELS = [
        {"n_orders": 3, "n_items": 2, "kinds": ["most_expensive"], "gift_card_fraction": 0.0},
        {"n_orders": 3, "n_items": 2, "kinds": ["most_expensive", "cheapest"], "gift_card_fraction": 0.0},
        {
            "n_orders": 4,
            "n_items": 2,
            "kinds": ["most_expensive", "cheapest", "by_option"],
            "gift_card_fraction": 0.1,
        },
        {"n_orders": 5, "n_items": 3, "kinds": list(KINDS), "gift_card_fraction": 0.3},
        {"n_orders": 6, "n_items": 3, "kinds": list(KINDS), "gift_card_fraction": 0.3},
        {"n_orders": 8, "n_items": 4, "kinds": list(KINDS), "gift_card_fraction": 0.4},
        {"n_orders": 10, "n_items": 5, "kinds": list(KINDS), "gift_card_fraction": 0.5},
    ]
    DEFAULT_LEVEL = 3  # (level 2 before the easiest level was added)
    WEIGHTS = {"order": 0.2, "item": 0.2, "payment": 0.2, "communicate": 0.4}

    @classmethod
    def shape(cls, profile: dict[str, Any]) -> dict[str, Any]:
        """The share of the LACKING conversations' refunds that go to a gift card, and the ways their users
        described the returned item (`return_described`), when their messages say."""
        g = profile["gift_card_share"]
        pins = {} if g is None else {"gift_card_fraction": round(clamp(g, 0.05, 0.95), 2)}
        described = profile.get("return_described") or {}
        kinds = [k for k in KINDS + SHAPED_KINDS if described.get(k)]
        return {**pins, "kinds": kinds} if kinds else pins

    def _validate_knobs(self) -> None:
        if self.knobs["n_items"] > 6:
            raise self._knob_error("n_items must be at most 6")
        if not self._kinds():
            raise self._knob_error(
                f"world {self.world.name!r} has no order dates: kinds must name more than most_recent"
            )

    def _kinds(self) -> list[str]:
        """The knob's kinds this world can pose: "most recent" needs order dates (τ²-retail's orders have none)."""
        return [x for x in self.knobs["kinds"] if x != "most_recent" or self.world.has("order_dates")]

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        c = self.customer(rng, k["n_orders"])
        b, uid = c.b, c.user["user_id"]
        kind = rng.choice(self._kinds())
        n_items = k["n_items"]
        reads: list[dict[str, Any]] = []
        answers = [uid]
        if kind == "most_recent":
            target, _, line, what = most_recent_delivered(rng, b, c.orders, max_extra=n_items - 1)
            reads = [
                call("list_user_orders", user_id=uid),
                call("get_order_details", order_id=target["order_id"]),
            ]
            answers.append(target["order_id"])
        else:
            target = rng.choice(c.orders)
            target["status"] = "delivered"
            if kind == "by_name":  # products all different: the name finds the line, its id is in the order
                lines = lines_of_other_products(b, n_items, set())
                line = rng.choice(lines)
                what = rng.choice(
                    [
                        "Please return the {p} from my order {o}.",
                        "I want to return the {p} I got in order {o}.",
                    ]
                ).format(p=line["name"], o=target["order_id"])
            elif kind == "by_option":
                product = rng.choice(list(b.db["products"]))
                v1, v2 = rng.sample(list(b.db["products"][product]["variants"]), 2)
                other, line = b.line(product, v1), b.line(product, v2)
                lines = [other, line] + lines_of_other_products(b, n_items - 2, {product})
                rng.shuffle(lines)
                key = rng.choice([x for x in line["options"] if line["options"][x] != other["options"][x]])
                what = rng.choice(
                    [
                        "In order {o} I got two {p} items; I want to return the one with {k} {v}.",
                        "Please return the {p} with {k} {v} from my order {o}.",
                    ]
                ).format(o=target["order_id"], p=line["name"], k=key, v=line["options"][key])
            else:
                lines, line = priced_lines(rng, b, n_items, max if kind == "most_expensive" else min)
                word = "most expensive" if kind == "most_expensive" else "cheapest"
                what = rng.choice(
                    [
                        "I want to return the {w} item in my order {o}.",
                        "From order {o}, please return the {w} item.",
                    ]
                ).format(w=word, o=target["order_id"])
            target["items"] = lines
            reads = [call("get_order_details", order_id=target["order_id"])]
        if rng.random() < k["gift_card_fraction"]:
            pm = gift_card(b, c.user)
            where = "Refund it to my gift card."
            reads.append(call("get_user_details", user_id=uid))
            answers.append(pm)
        else:
            pm = target["payment_method_id"]
            where = "Refund it to the original payment method."
        price = f"{line['price']:.2f}"
        answers += [line["item_id"], price]
        oid = target["order_id"]
        reference = [
            c.auth,
            *reads,
            call(
                "return_delivered_order_items", order_id=oid, item_ids=[line["item_id"]], payment_method_id=pm
            ),
            say(
                f"The return of the {line['name']} from order {oid} is requested. "
                f"You will get {price} dollars back to {pm}."
            ),
        ]
        return scenario(
            c,
            f"{what} {where} How much will I get back?",
            reference,
            answers,
            required_facts=[price],
            variant=kind,
            data={"order_id": oid, "item_id": line["item_id"], "payment_method_id": pm},
        )

    def grade(self) -> tuple[dict[str, float], dict[str, Any]]:
        d = self._scenario.data
        changed = self.changed("orders")
        order = self.record("orders", d["order_id"])
        order_ok = changed == {d["order_id"]} and not self.changed("users")
        item_ok = order_ok and order.get("return_items") == [d["item_id"]]
        pm_ok = order_ok and self.world.refund_method(order) == d["payment_method_id"]
        comm, missing, wrong = self.communicate()
        return (
            {"order": float(order_ok), "item": float(item_ok), "payment": float(pm_ok), "communicate": comm},
            {"changed_orders": sorted(changed), "missing_facts": missing, "wrong_facts": wrong},
        )
