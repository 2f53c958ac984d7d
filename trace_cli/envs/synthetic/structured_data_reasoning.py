"""Template `structured_data_reasoning`: pick the right record out of tool output full of distractors.

The user wants to return one item, described by a property the agent must work out from the data: the most
expensive / cheapest item of an order, the variant with a given option, or a product from the most recent
*delivered* order (newer undelivered and older delivered orders hold the same product). The item id, the
order (for "most recent") and the refund amount are never in the request.

Reward = 0.2·order + 0.2·item + 0.2·payment + 0.4·communicate: the return targets the right order (and no
other order changed), the right item, the right refund method; the refund amount is told to the user.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, call, say
from trace_cli.envs.synthetic.common import gift_card, identify, lines_of_other_products, world
from trace_cli.errors import UsageError

KINDS = ("most_expensive", "cheapest", "by_option", "most_recent")


class StructuredDataReasoning(SyntheticEnv):
    capability = "structured_data_reasoning"
    description = (
        "Return the item the user describes by a property (most expensive, cheapest, an option, most "
        "recent delivered order) among distractor orders, items and variants."
    )
    TOOLS = (
        "find_user_id_by_email",
        "find_user_id_by_name_zip",
        "list_user_orders",
        "get_order_details",
        "get_user_details",
        "return_delivered_order_items",
    )
    KNOBS = {
        "n_orders": Knob(int, 3, 10, doc="orders of the customer"),
        "n_items": Knob(int, 2, 5, doc="items in the order the answer is in (distractor items)"),
        "kinds": Knob(list, choices=KINDS, doc="how the item is described"),
        "gift_card_fraction": Knob(float, 0.0, 1.0, doc="probability that the refund goes to a gift card"),
    }
    LEVELS = [
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
    WEIGHTS = {"order": 0.2, "item": 0.2, "payment": 0.2, "communicate": 0.4}

    def _validate_knobs(self) -> None:
        if self.knobs["n_items"] > 6:
            raise UsageError(f"{self.capability}: n_items must be at most 6")

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        b, user, orders = world(rng, k["n_orders"])
        ident, auth = identify(rng, user)
        uid = user["user_id"]
        kind = rng.choice(k["kinds"])
        n_items = k["n_items"]
        reads: list[dict[str, Any]] = []
        answers = [uid]
        if kind == "most_recent":
            n = len(orders)
            m = (
                n - 2 if rng.random() < 0.6 else n - 1
            )  # the target: the newest delivered order with the product
            o = rng.randrange(
                0, m
            )  # an older delivered order with the same product (other older ones may too)
            product = rng.choice(list(b.db["products"]))
            for i, order in enumerate(orders):
                if i > m:
                    order["status"] = rng.choice(["pending", "processed"])
                    order["items"] = [b.random_line(product)] + lines_of_other_products(
                        b, rng.randint(0, n_items - 1), {product}
                    )
                elif i in (m, o):
                    order["status"] = "delivered"
                    order["items"] = lines_of_other_products(b, rng.randint(0, n_items - 1), {product})
                    order["items"].insert(rng.randint(0, len(order["items"])), b.random_line(product))
            target = orders[m]
            line = next(x for x in target["items"] if x["product_id"] == product)
            what = rng.choice(
                [
                    "I want to return the {p} from my most recent delivered order.",
                    "Please return the {p} that came in my latest delivered order.",
                ]
            ).format(p=line["name"])
            reads = [
                call("list_user_orders", user_id=uid),
                call("get_order_details", order_id=target["order_id"]),
            ]
            answers.append(target["order_id"])
        else:
            target = rng.choice(orders)
            target["status"] = "delivered"
            if kind == "by_option":
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
                while True:
                    lines = lines_of_other_products(b, n_items, set())
                    if len({x["price"] for x in lines}) == n_items:
                        break
                pick = max if kind == "most_expensive" else min
                line = pick(lines, key=lambda x: x["price"])
                if lines[0] is line:  # the first item listed is never the answer
                    j = rng.randint(1, n_items - 1)
                    lines[0], lines[j] = lines[j], lines[0]
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
            pm = gift_card(b, user)
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
            auth,
            *reads,
            call(
                "return_delivered_order_items", order_id=oid, item_ids=[line["item_id"]], payment_method_id=pm
            ),
            say(
                f"The return of the {line['name']} from order {oid} is requested. "
                f"You will get {price} dollars back to {pm}."
            ),
        ]
        return Scenario(
            b.db,
            uid,
            ident,
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
        order = self.db["orders"][d["order_id"]]
        order_ok = changed == {d["order_id"]} and not self.changed("users")
        item_ok = order_ok and order.get("return_items") == [d["item_id"]]
        pm_ok = order_ok and (order.get("refund") or {}).get("payment_method_id") == d["payment_method_id"]
        comm, missing, wrong = self.communicate()
        return (
            {"order": float(order_ok), "item": float(item_ok), "payment": float(pm_ok), "communicate": comm},
            {"changed_orders": sorted(changed), "missing_facts": missing, "wrong_facts": wrong},
        )
