"""What every retail task is made of, shared by the shop's task families and the capability templates (on any
retail-family world: the shop, τ²-retail).

A task starts with a generated world and one customer who identifies themselves (`customer`); requests are
phrased and solved with the same pieces (`cancel_op`, `return_op`, `address_op`, ...). Everything is drawn
from the `random.Random` passed in, in a fixed order: the shop's tasks and the templates' scenarios for a
given seed depend on that order (committed models and experiments were trained on them), so a helper here
must keep its draws exactly as they are.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trace_cli.envs.worlds.generator import CANCEL_REASONS, WorldBuilder, money

Action = dict[str, Any]
Op = tuple[str, list[Action], str]  # (request text, actions that carry it out, report when done)

ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled")

# The authentication tools: every task exposes them, and `identify` pairs each self-identification with one.
AUTH_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip")
# The two changes to an order whose permission depends on its status (cancel: pending; return: delivered).
ORDER_CHANGES = ("cancel_pending_order", "return_delivered_order_items")
# The hand-off to a human: every task offers it, last.
HANDOFF = "transfer_to_human_agents"

STATE_NAMES = {
    "TX": "Texas",
    "MA": "Massachusetts",
    "NJ": "New Jersey",
    "CO": "Colorado",
    "WA": "Washington",
    "ME": "Maine",
    "IL": "Illinois",
    "CT": "Connecticut",
    "AZ": "Arizona",
    "FL": "Florida",
    "VT": "Vermont",
    "OH": "Ohio",
}

REASON_PHRASES = {
    "no longer needed": ["I no longer need it", "it is no longer needed"],
    "ordered by mistake": ["I ordered it by mistake", "it was ordered by mistake"],
}


@dataclass
class Task:
    """One generated task: database, what the user says and knows, and the hidden solutions."""

    family: str
    capabilities: list[str]
    db: dict[str, Any]
    user_id: str
    identify: str  # how the user identifies themselves, e.g. "My email is ..."
    request: str  # the request, as the first message states it (after the identification)
    tools: list[str]
    reference: list[Action]
    required_facts: list[str] = field(default_factory=list)  # must appear in the agent's messages
    # Must NOT appear: wrong statuses, so that listing every possible status cannot game the check.
    forbidden_facts: list[str] = field(default_factory=list)
    deficit_demos: dict[str, list[Action]] = field(default_factory=dict)  # capability -> demonstration
    variant: str = ""  # sub-case of the family, for statistics only

    @property
    def first_message(self) -> str:
        return f"{self.identify} {self.request}"


def call(name: str, **arguments: Any) -> Action:
    return {"name": name, "arguments": arguments}


def say(text: str) -> Action:
    return {"content": text}


def task_tools(*needed: str) -> list[str]:
    """The tools a shop task exposes: authentication, the ones it needs, and the transfer to a human."""
    return [*AUTH_TOOLS, *needed, HANDOFF]


# -- the customer ----------------------------------------------------------------------------------------


def identity_keys(user: dict[str, Any]) -> set[Any]:
    return {(user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]), user["email"]}


def world(
    rng: random.Random,
    n_orders: int,
    *,
    n_products: int = 8,
    statuses: tuple[str, ...] = ORDER_STATUSES,
    weights: tuple[int, ...] = (3, 2, 4, 1),
    n_others: int = 2,
    builder: Callable[[random.Random], WorldBuilder] = WorldBuilder,
) -> tuple[WorldBuilder, dict[str, Any], list[dict[str, Any]]]:
    """Products, the customer with `n_orders` dated orders (returned oldest first) and other customers, drawn
    by `builder` (a world's generator: `World.builder`)."""
    b = builder(rng)
    b.add_products(n_products)
    user = b.add_user()
    orders = [
        b.add_order(user, rng.choices(statuses, weights)[0], date=d) for d in b.distinct_dates(n_orders)
    ]
    rng.shuffle(user["orders"])  # listing order differs from date order: "most recent" needs the dates
    taken = identity_keys(user)
    for _ in range(n_others):
        other = b.add_user()
        while identity_keys(other) & taken:  # identification must be unambiguous
            del b.db["users"][other["user_id"]]
            other = b.add_user()
        taken |= identity_keys(other)
        for _ in range(2):
            b.add_order(other, rng.choice(["pending", "delivered"]))
    return b, user, orders


def identify(rng: random.Random, user: dict[str, Any]) -> tuple[str, Action]:
    """The user's self-identification (email, or name + zip) and the matching authentication call."""
    n = user["name"]
    if rng.random() < 0.5:
        text = rng.choice(["Hi, my email is {e}.", "Hello, this is {e}.", "Hi! My email address is {e}."])
        return text.format(e=user["email"]), call("find_user_id_by_email", email=user["email"])
    z = user["address"]["zip"]
    text = rng.choice(
        [
            "Hi, I'm {f} {l}, zip code {z}.",
            "Hello, my name is {f} {l} and my zip is {z}.",
            "Hi, {f} {l} here (zip {z}).",
        ]
    )
    return (
        text.format(f=n["first_name"], l=n["last_name"], z=z),
        call("find_user_id_by_name_zip", first_name=n["first_name"], last_name=n["last_name"], zip=z),
    )


class Customer(NamedTuple):
    """A generated world and the customer who has just identified themselves (`auth` verifies them)."""

    b: WorldBuilder
    user: dict[str, Any]
    orders: list[dict[str, Any]]  # oldest first
    identify: str
    auth: Action


def customer(
    rng: random.Random, n_orders: int, builder: Callable[[random.Random], WorldBuilder] = WorldBuilder
) -> Customer:
    """`world`, then `identify`: how most tasks begin."""
    b, user, orders = world(rng, n_orders, builder=builder)
    return Customer(b, user, orders, *identify(rng, user))


# -- requests and their solutions -------------------------------------------------------------------------


def describe(options: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def address_text(a: dict[str, str]) -> str:
    parts = (
        [a["address1"]]
        + ([a["address2"]] if a["address2"] else [])
        + [a["city"], f"{a['state']} {a['zip']}", a["country"]]
    )
    return ", ".join(parts)


def new_address(
    b: WorldBuilder, user: dict[str, Any], *, leading_zero: bool | None = None, address2: bool | None = None
) -> dict[str, str]:
    """A fresh address, optionally forcing a zip with a leading zero and/or a second address line."""
    while True:
        a = b.random_address()
        if leading_zero is not None and a["zip"].startswith("0") != leading_zero:
            continue
        if address2 is not None and bool(a["address2"]) != address2:
            continue
        if a != user["address"]:
            return a


def gift_card(b: WorldBuilder, user: dict[str, Any], min_balance: float = 0.0) -> str:
    """The user's gift card id, creating one (or topping it up) so that it covers `min_balance`."""
    for pm, m in user["payment_methods"].items():
        if m["source"] == "gift_card":
            m["balance"] = max(m["balance"], money(min_balance + 10))
            return pm
    pm = f"gift_card_{b.digits(7)}"
    user["payment_methods"][pm] = {"source": "gift_card", "balance": money(max(min_balance + 10, 25))}
    return pm


def lines_of_other_products(b: WorldBuilder, k: int, exclude: set[str]) -> list[dict[str, Any]]:
    """k order lines of k distinct products, none of them in `exclude`."""
    out, seen = [], set(exclude)
    for _ in range(k):
        line = b.random_line(exclude_products=seen)
        seen.add(line["product_id"])
        out.append(line)
    return out


def most_recent_delivered(
    rng: random.Random, b: WorldBuilder, orders: list[dict[str, Any]], max_extra: int
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """A request for "the <product> from my most recent delivered order", planted in `orders` (oldest first):
    an older delivered order holds the same product, and (often) an even more recent order that is not
    delivered holds it too; each has up to `max_extra` other lines. (target order, the older delivered
    one, the line to return, the request text)."""
    n = len(orders)
    m = n - 2 if rng.random() < 0.6 else n - 1
    o = rng.randrange(0, m)
    product = rng.choice(list(b.db["products"]))
    for i, order in enumerate(orders):
        if i > m:
            order["status"] = rng.choice(["pending", "processed"])
            order["items"] = [b.random_line(product)] + lines_of_other_products(
                b, rng.randint(0, max_extra), {product}
            )
        elif i in (m, o):
            order["status"] = "delivered"
            order["items"] = lines_of_other_products(b, rng.randint(0, max_extra), {product})
            order["items"].insert(rng.randint(0, len(order["items"])), b.random_line(product))
    target = orders[m]
    line = next(x for x in target["items"] if x["product_id"] == product)
    what = rng.choice(
        [
            "I want to return the {p} from my most recent delivered order.",
            "Please return the {p} that came in my latest delivered order.",
        ]
    ).format(p=line["name"])
    return target, orders[o], line, what


def priced_lines(
    rng: random.Random, b: WorldBuilder, n: int, pick=max
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """n lines of distinct products and prices, and the one `pick` (max/min) chooses by price, never listed first."""
    while True:
        lines = lines_of_other_products(b, n, set())
        if len({x["price"] for x in lines}) == n:
            break
    line = pick(lines, key=lambda x: x["price"])
    if lines[0] is line:  # the first item listed is never the answer
        j = rng.randint(1, n - 1)
        lines[0], lines[j] = lines[j], lines[0]
    return lines, line


def address_change(rng: random.Random, auth: Action, uid: str, a: dict[str, str]) -> tuple[str, list[Action]]:
    """A request to change the default address to `a`, written as one line of prose, and its solution."""
    request = rng.choice(
        [
            "Please update my default address to {t}.",
            "I moved. My new address is {t}.",
            "Can you change my address to {t}?",
        ]
    ).format(t=address_text(a))
    write = call("modify_user_address", user_id=uid, **a)
    return request, [auth, write, say(f"Your default address is now {address_text(a)}.")]


def join_ops(texts: list[str]) -> str:
    if len(texts) == 1:
        return texts[0]
    return numbered(texts)


def numbered(texts: list[str]) -> str:
    return "; ".join(f"{i + 1}) {t}" for i, t in enumerate(texts))


def several_things(texts: list[str]) -> str:
    """The request of a multi-operation task (numbered, also when there is one operation)."""
    return "I need several things done: " + numbered(texts) + "."


def cancel_op(rng: random.Random, oid: str, *, read: bool) -> Op:
    """Cancel order `oid` for a reason the user phrases in their own words (`read`: look at the order first)."""
    reason = rng.choice(CANCEL_REASONS)
    text = f"cancel order {oid} ({rng.choice(REASON_PHRASES[reason])})"
    actions = [call("get_order_details", order_id=oid)] if read else []
    actions.append(call("cancel_pending_order", order_id=oid, reason=reason))
    return text, actions, f"order {oid} is cancelled"


def return_op(order: dict[str, Any], line: dict[str, Any]) -> Op:
    """Return one line of a delivered order to its original payment method (the order is read for the id)."""
    oid = order["order_id"]
    return (
        f"return the {line['name']} from order {oid} to the original payment method",
        [
            call("get_order_details", order_id=oid),
            call(
                "return_delivered_order_items",
                order_id=oid,
                item_ids=[line["item_id"]],
                payment_method_id=order["payment_method_id"],
            ),
        ],
        f"the return of the {line['name']} from order {oid} is requested",
    )


def address_op(b: WorldBuilder, user: dict[str, Any]) -> Op:
    """Change the default address; the fields are spelled out one by one (finishing, not parsing, is tested)."""
    a = new_address(b, user)
    text = (
        f"change my default address to address1 '{a['address1']}', address2 '{a['address2']}', "
        f"city '{a['city']}', state '{a['state']}', country '{a['country']}', zip '{a['zip']}'"
    )
    return (
        text,
        [call("modify_user_address", user_id=user["user_id"], **a)],
        "your default address is updated",
    )


def done(ops: list[Op]) -> Action:
    """The closing message of a task made of several operations."""
    return say("Done: " + "; ".join(r for _, _, r in ops) + ".")
