"""Task families of the shop world: each builds a database, a request, a reference solution and deficit demos.

A family is a function `build(rng, n_orders) -> Task`. Everything is drawn from the `random.Random` it is
given, so a (seed, family) pair always yields the same task. The reference solution is written here from
ground truth; the environment replays it once at reset to obtain the target database state, so reward and
reference can never drift apart.

Deficit demonstrations are the reference with one capability withheld; each family's deficit is built so
that it fails (by construction) on every seed where the capability matters:

  precondition_verification  cancel_order: writes without reading the order, then claims success.
                             80 % of cancel_order seeds ask to cancel a non-pending order (so the deficit
                             agent succeeds only on the 20 % where blind execution happens to be right).
  structured_data_reasoning  return_item: takes the first candidate (first delivered order listed, first
                             item, first item with the product's name) — never the right one here.
  multi_step_completion      multi_op: stops after the first write (every multi_op task needs >= 2 writes).
  tool_calling_precision     address_update / exchange: one ill-formatted argument (order id without '#',
                             zip as a number or without its leading zero, id of the wrong kind, ...).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.shop.world import WorldBuilder, money, order_total

CAPABILITIES = (
    "precondition_verification",
    "structured_data_reasoning",
    "multi_step_completion",
    "tool_calling_precision",
)

Action = dict[str, Any]

ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled")

# The tools every family exposes, then each family adds the few it needs (canonical schemas throughout).
_BASE_TOOLS = ["find_user_id_by_email", "find_user_id_by_name_zip"]
_LAST_TOOLS = ["transfer_to_human_agents"]

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


# -- shared setup --------------------------------------------------------------------------------------


def _identity_keys(user: dict[str, Any]) -> set[Any]:
    return {(user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]), user["email"]}


def _setup(rng: random.Random, n_orders: int) -> tuple[WorldBuilder, dict[str, Any], list[dict[str, Any]]]:
    """A world with products, the customer (with n_orders dated orders) and two other customers."""
    b = WorldBuilder(rng)
    b.add_products(8)
    user = b.add_user()
    orders = [
        b.add_order(user, rng.choices(ORDER_STATUSES, [3, 2, 4, 1])[0], date=d)
        for d in b.distinct_dates(n_orders)
    ]
    rng.shuffle(user["orders"])  # listing order differs from date order: "most recent" needs the dates
    taken = _identity_keys(user)
    for _ in range(2):
        other = b.add_user()
        while _identity_keys(other) & taken:  # identification must be unambiguous
            del b.db["users"][other["user_id"]]
            other = b.add_user()
        taken |= _identity_keys(other)
        for _ in range(2):
            b.add_order(other, rng.choice(["pending", "delivered"]))
    return b, user, orders  # `orders` is sorted by date, oldest first


def _identify(rng: random.Random, user: dict[str, Any]) -> tuple[str, Action]:
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


def _describe(options: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def _gift_card(b: WorldBuilder, user: dict[str, Any], min_balance: float = 0.0) -> str:
    """The user's gift card id, creating one (or topping it up) so that it covers `min_balance`."""
    for pm, m in user["payment_methods"].items():
        if m["source"] == "gift_card":
            m["balance"] = max(m["balance"], money(min_balance + 10))
            return pm
    pm = f"gift_card_{b.digits(7)}"
    user["payment_methods"][pm] = {"source": "gift_card", "balance": money(max(min_balance + 10, 25))}
    return pm


def _other_products_lines(b: WorldBuilder, k: int, exclude: set[str]) -> list[dict[str, Any]]:
    lines = []
    seen = set(exclude)
    for _ in range(k):
        line = b.random_line(exclude_products=seen)
        seen.add(line["product_id"])
        lines.append(line)
    return lines


# -- families ------------------------------------------------------------------------------------------


def build_order_status(rng: random.Random, n_orders: int) -> Task:
    b, user, orders = _setup(rng, n_orders)
    order = rng.choice(orders)
    oid, status, total = order["order_id"], order["status"], order_total(order)
    ident, auth = _identify(rng, user)
    request = rng.choice(
        [
            "What is the status of my order {o}, and what was its total?",
            "Can you tell me the status and the total amount of order {o}?",
            "I'd like to know the status of order {o} and how much it cost.",
        ]
    ).format(o=oid)
    reference = [
        auth,
        call("get_order_details", order_id=oid),
        say(f"Your order {oid} is {status}, and its total is {total:.2f} dollars."),
    ]
    return Task(
        "order_status",
        [],
        b.db,
        user["user_id"],
        ident,
        request,
        _BASE_TOOLS + ["get_user_details", "list_user_orders", "get_order_details"] + _LAST_TOOLS,
        reference,
        required_facts=[status, f"{total:.2f}"],
        forbidden_facts=[x for x in ORDER_STATUSES if x != status],
        variant=status,
    )


def build_cancel_order(rng: random.Random, n_orders: int) -> Task:
    b, user, orders = _setup(rng, n_orders)
    order = rng.choice(orders)
    allowed = rng.random() < 0.2  # forbidden requests dominate so that blind execution mostly fails
    order["status"] = "pending" if allowed else rng.choice(["processed", "delivered"])
    oid, status = order["order_id"], order["status"]
    reason = rng.choice(CANCEL_REASONS)
    ident, auth = _identify(rng, user)
    request = rng.choice(
        [
            "Please cancel my order {o}; {r}.",
            "I want to cancel order {o} because {r}.",
            "Could you cancel order {o}? {R}.",
        ]
    )
    phrase = rng.choice(REASON_PHRASES[reason])
    request = request.format(o=oid, r=phrase, R=phrase[0].upper() + phrase[1:])
    if allowed:
        total = order_total(order)
        reference = [
            auth,
            call("get_order_details", order_id=oid),
            call("cancel_pending_order", order_id=oid, reason=reason),
            say(
                f"Order {oid} is cancelled. {total:.2f} dollars will be refunded to "
                f"{order['payment_method_id']}."
            ),
        ]
        facts: list[str] = []
    else:
        reference = [
            auth,
            call("get_order_details", order_id=oid),
            say(f"Sorry, order {oid} is {status}. Only pending orders can be cancelled."),
        ]
        facts = [status]
    blind = [
        auth,
        call("cancel_pending_order", order_id=oid, reason=reason),
        say(f"Order {oid} is cancelled."),
    ]
    return Task(
        "cancel_order",
        ["precondition_verification"],
        b.db,
        user["user_id"],
        ident,
        request,
        _BASE_TOOLS + ["get_order_details", "list_user_orders", "cancel_pending_order"] + _LAST_TOOLS,
        reference,
        required_facts=facts,
        forbidden_facts=[x for x in ("processed", "delivered") if x != status] if not allowed else [],
        deficit_demos={"precondition_verification": blind},
        variant="allowed" if allowed else "forbidden",
    )


def build_return_item(rng: random.Random, n_orders: int) -> Task:
    b, user, orders = _setup(rng, n_orders)
    ident, auth = _identify(rng, user)
    uid = user["user_id"]
    variant = rng.choice(["most_recent", "most_expensive", "by_option"])
    reads: list[Action] = []
    wrong_reads: list[Action] = []
    if variant == "most_recent":
        # Target = most recent delivered order; an older delivered order holds the same product, and
        # (often) an even more recent order that is not delivered holds it too.
        n = len(orders)
        m = n - 2 if rng.random() < 0.6 else n - 1
        o = rng.randrange(0, m)
        product = rng.choice(list(b.db["products"]))
        for i, order in enumerate(orders):
            if i > m:
                order["status"] = rng.choice(["pending", "processed"])
                order["items"] = [b.random_line(product)] + _other_products_lines(
                    b, rng.randint(0, 1), {product}
                )
            elif i in (m, o):
                order["status"] = "delivered"
                order["items"] = _other_products_lines(b, rng.randint(0, 1), {product})
                order["items"].insert(rng.randint(0, len(order["items"])), b.random_line(product))
        target = orders[m]
        listing = user["orders"]
        delivered = [x for x in listing if b.db["orders"][x]["status"] == "delivered"]
        if delivered[0] == target["order_id"]:  # make the first-listed delivered order a wrong one
            i, j = listing.index(target["order_id"]), listing.index(orders[o]["order_id"])
            listing[i], listing[j] = listing[j], listing[i]
        wrong = b.db["orders"][next(x for x in listing if b.db["orders"][x]["status"] == "delivered")]
        line = next(x for x in target["items"] if x["product_id"] == product)
        wrong_line = wrong["items"][0]
        name = line["name"]
        what = rng.choice(
            [
                "I want to return the {p} from my most recent delivered order.",
                "Please return the {p} that came in my latest delivered order.",
            ]
        ).format(p=name)
        list_call = call("list_user_orders", user_id=uid)
        reads = [list_call, call("get_order_details", order_id=target["order_id"])]
        wrong_reads = [list_call, call("get_order_details", order_id=wrong["order_id"])]
    else:
        target = rng.choice(orders)
        target["status"] = "delivered"
        wrong = target
        if variant == "most_expensive":
            while True:
                lines = _other_products_lines(b, 3, set())
                if len({x["price"] for x in lines}) == 3:
                    break
            best = max(lines, key=lambda x: x["price"])
            if lines[0] is best:  # the first item must not be the answer
                k = rng.randint(1, 2)
                lines[0], lines[k] = lines[k], lines[0]
            line, wrong_line = best, lines[0]
            what = rng.choice(
                [
                    "I want to return the most expensive item in my order {o}.",
                    "From order {o}, please return the item that cost the most.",
                ]
            )
            what = what.format(o=target["order_id"])
        else:
            product = rng.choice(list(b.db["products"]))
            v1, v2 = rng.sample(list(b.db["products"][product]["variants"]), 2)
            first, line = b.line(product, v1), b.line(product, v2)
            lines = [first, line] + _other_products_lines(b, rng.randint(0, 1), {product})
            wrong_line = first
            key = next(k for k in line["options"] if line["options"][k] != first["options"][k])
            what = rng.choice(
                [
                    "In order {o} I got two {p} items; I want to return the one with {k} {v}.",
                    "Please return the {p} with {k} {v} from my order {o}.",
                ]
            )
            what = what.format(o=target["order_id"], p=line["name"], k=key, v=line["options"][key])
        target["items"] = lines
        reads = [call("get_order_details", order_id=target["order_id"])]
        wrong_reads = reads
    to_gift = rng.random() < 0.3
    if to_gift:
        pm = _gift_card(b, user)
        where = "Refund it to my gift card."
        reads = reads + [call("get_user_details", user_id=uid)]
        wrong_reads = wrong_reads + [call("get_user_details", user_id=uid)]
    else:
        pm = target["payment_method_id"]
        where = "Refund it to the original payment method."
    request = f"{what} {where} How much will I get back?"
    price = line["price"]

    def solve(order: dict[str, Any], item: dict[str, Any], pre: list[Action]) -> list[Action]:
        return [
            auth,
            *pre,
            call(
                "return_delivered_order_items",
                order_id=order["order_id"],
                item_ids=[item["item_id"]],
                payment_method_id=pm,
            ),
            say(
                f"The return of the {item['name']} from order {order['order_id']} is requested. "
                f"You will get {item['price']:.2f} dollars back to {pm}."
            ),
        ]

    return Task(
        "return_item",
        ["structured_data_reasoning"],
        b.db,
        uid,
        ident,
        request,
        _BASE_TOOLS
        + ["get_user_details", "list_user_orders", "get_order_details", "return_delivered_order_items"]
        + _LAST_TOOLS,
        solve(target, line, reads),
        required_facts=[f"{price:.2f}"],
        deficit_demos={"structured_data_reasoning": solve(wrong, wrong_line, wrong_reads)},
        variant=variant,
    )


def _address_text(a: dict[str, str]) -> str:
    parts = (
        [a["address1"]]
        + ([a["address2"]] if a["address2"] else [])
        + [a["city"], f"{a['state']} {a['zip']}", a["country"]]
    )
    return ", ".join(parts)


def _new_address(b: WorldBuilder, user: dict[str, Any]) -> dict[str, str]:
    while True:
        address = b.random_address()
        if address != user["address"]:
            return address


def build_multi_op(rng: random.Random, n_orders: int) -> Task:
    b, user, orders = _setup(rng, n_orders)
    ident, auth = _identify(rng, user)
    uid = user["user_id"]
    while True:  # 2-5 writes: up to two cancels, two returns and one address change
        n_cancel, n_return, n_address = rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 1)
        if 2 <= n_cancel + n_return + n_address and n_cancel + n_return <= len(orders):
            break
    picked = rng.sample(orders, n_cancel + n_return)
    ops: list[tuple[str, list[Action], str]] = []  # (request text, actions, report when done)
    for order in picked[:n_cancel]:
        order["status"] = "pending"
        oid = order["order_id"]
        reason = rng.choice(CANCEL_REASONS)
        ops.append(
            (
                f"cancel order {oid} ({rng.choice(REASON_PHRASES[reason])})",
                [call("cancel_pending_order", order_id=oid, reason=reason)],
                f"order {oid} is cancelled",
            )
        )
    for order in picked[n_cancel:]:
        order["status"] = "delivered"
        oid = order["order_id"]
        line = rng.choice(order["items"])
        ops.append(
            (
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
        )
    if n_address:
        a = _new_address(b, user)
        # Fields are spelled out one by one: this family tests finishing every step, not parsing.
        text = (
            f"change my default address to address1 '{a['address1']}', address2 '{a['address2']}', "
            f"city '{a['city']}', state '{a['state']}', country '{a['country']}', zip '{a['zip']}'"
        )
        ops.append((text, [call("modify_user_address", user_id=uid, **a)], "your default address is updated"))
    rng.shuffle(ops)
    request = (
        "I need several things done: " + "; ".join(f"{i + 1}) {t}" for i, (t, _, _) in enumerate(ops)) + "."
    )
    check = call("list_user_orders", user_id=uid)  # one read shows every order's status
    reference = [auth, check] + [a for _, acts, _ in ops for a in acts]
    reference.append(say("Done: " + "; ".join(r for _, _, r in ops) + "."))
    _, first_actions, first_report = ops[0]
    partial = [auth, check, *first_actions, say(f"Done: {first_report}.")]
    return Task(
        "multi_op",
        ["multi_step_completion"],
        b.db,
        uid,
        ident,
        request,
        _BASE_TOOLS
        + [
            "list_user_orders",
            "get_order_details",
            "cancel_pending_order",
            "return_delivered_order_items",
            "modify_user_address",
        ]
        + _LAST_TOOLS,
        reference,
        deficit_demos={"multi_step_completion": partial},
        variant=f"{len(ops)}_ops",
    )


def build_address_update(rng: random.Random, n_orders: int) -> Task:
    b, user, _ = _setup(rng, n_orders)
    ident, auth = _identify(rng, user)
    uid = user["user_id"]
    a = _new_address(b, user)
    request = rng.choice(
        [
            "Please update my default address to {t}.",
            "I moved. My new address is {t}.",
            "Can you change my address to {t}?",
        ]
    ).format(t=_address_text(a))
    write = call("modify_user_address", user_id=uid, **a)
    reference = [auth, write, say(f"Your default address is now {_address_text(a)}.")]
    # Ill-formatted variants that a careless agent produces; each either fails the schema/lookup or
    # stores a wrong address.
    bad: dict[str, dict[str, Any]] = {
        "zip_as_number": dict(a, zip=int(a["zip"])),
        "state_spelled_out": dict(a, state=STATE_NAMES[a["state"]]),
        "user_id_without_suffix": {"user_id": uid.rsplit("_", 1)[0]},
    }
    if a["zip"].startswith("0"):
        bad["zip_leading_zero_dropped"] = dict(a, zip=str(int(a["zip"])))
    if a["address2"]:
        bad["address_lines_merged"] = dict(a, address1=f"{a['address1']}, {a['address2']}", address2="")
    kind = rng.choice(sorted(bad))
    args = dict(write["arguments"], **bad[kind])
    sloppy = [auth, call("modify_user_address", **args), say("Your address has been updated.")]
    return Task(
        "address_update",
        ["tool_calling_precision"],
        b.db,
        uid,
        ident,
        request,
        _BASE_TOOLS + ["get_user_details", "modify_user_address"] + _LAST_TOOLS,
        reference,
        deficit_demos={"tool_calling_precision": sloppy},
        variant=kind,
    )


def build_exchange(rng: random.Random, n_orders: int) -> Task:
    b, user, orders = _setup(rng, n_orders)
    ident, auth = _identify(rng, user)
    uid = user["user_id"]
    order = rng.choice(orders)
    order["status"] = "delivered"
    line = rng.choice(order["items"])
    product = b.db["products"][line["product_id"]]
    choices = [v for iid, v in product["variants"].items() if iid != line["item_id"]]
    new = rng.choice(choices)
    new["available"] = True  # the requested variant can be exchanged to
    diff = money(new["price"] - line["price"])
    if rng.random() < 0.3:
        pm, pay = _gift_card(b, user, max(diff, 0.0)), "Use my gift card for any price difference."
        pay_reads = [call("get_user_details", user_id=uid)]
    else:
        pm, pay, pay_reads = order["payment_method_id"], "Use the original payment method.", []
    request = (
        f"In my order {order['order_id']} I'd like to exchange the {line['name']} "
        f"({_describe(line['options'])}) for the one with {_describe(new['options'])}. {pay}"
    )
    oid = order["order_id"]
    reads = [
        call("get_order_details", order_id=oid),
        call("get_product_details", product_id=line["product_id"]),
        *pay_reads,
    ]
    good = {
        "order_id": oid,
        "item_ids": [line["item_id"]],
        "new_item_ids": [new["item_id"]],
        "payment_method_id": pm,
    }
    reference = [
        auth,
        *reads,
        call("exchange_delivered_order_items", **good),
        say(f"The exchange in order {oid} is requested; the price difference is {diff:.2f} dollars."),
    ]
    bad = {
        "order_id_without_hash": {"order_id": oid.lstrip("#")},
        "product_id_as_new_item": {"new_item_ids": [line["product_id"]]},
        "item_ids_as_numbers": {"item_ids": [int(line["item_id"])], "new_item_ids": [int(new["item_id"])]},
        "item_ids_as_string": {"item_ids": line["item_id"]},
    }
    kind = rng.choice(sorted(bad))
    sloppy = [
        auth,
        *reads,
        call("exchange_delivered_order_items", **dict(good, **bad[kind])),
        say("Your exchange has been requested."),
    ]
    return Task(
        "exchange",
        ["tool_calling_precision"],
        b.db,
        uid,
        ident,
        request,
        _BASE_TOOLS
        + ["get_user_details", "get_order_details", "get_product_details", "exchange_delivered_order_items"]
        + _LAST_TOOLS,
        reference,
        deficit_demos={"tool_calling_precision": sloppy},
        variant=kind,
    )


FAMILIES: dict[str, Callable[[random.Random, int], Task]] = {
    "order_status": build_order_status,
    "cancel_order": build_cancel_order,
    "return_item": build_return_item,
    "multi_op": build_multi_op,
    "address_update": build_address_update,
    "exchange": build_exchange,
}

# Hidden metadata: which capabilities a family's success depends on (never shown to the agent).
FAMILY_CAPABILITIES: dict[str, list[str]] = {
    "order_status": [],
    "cancel_order": ["precondition_verification"],
    "return_item": ["structured_data_reasoning"],
    "multi_op": ["multi_step_completion"],
    "address_update": ["tool_calling_precision"],
    "exchange": ["tool_calling_precision"],
}
