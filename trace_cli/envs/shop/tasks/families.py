"""The shop's six task families, one `build_<family>(rng, n_orders) -> Task` each (see the package docstring)."""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.worlds.generator import money, order_total
from trace_cli.envs.worlds.tasks import (
    ORDER_STATUSES,
    REASON_PHRASES,
    STATE_NAMES,
    Action,
    Op,
    Task,
    address_change,
    address_op,
    call,
    cancel_op,
    customer,
    describe,
    done,
    gift_card,
    identify,
    lines_of_other_products,
    most_recent_delivered,
    new_address,
    priced_lines,
    return_op,
    say,
    several_things,
    task_tools,
    world,
)


def build_order_status(rng: random.Random, n_orders: int) -> Task:
    """Family `order_status`: report an order's status and total (needs no capability; the baseline family)."""
    b, user, orders = world(rng, n_orders)
    order = rng.choice(orders)
    oid, status, total = order["order_id"], order["status"], order_total(order)
    ident, auth = identify(rng, user)
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
        task_tools("get_user_details", "list_user_orders", "get_order_details"),
        reference,
        required_facts=[status, f"{total:.2f}"],
        forbidden_facts=[x for x in ORDER_STATUSES if x != status],
        variant=status,
    )


def build_cancel_order(rng: random.Random, n_orders: int) -> Task:
    """Family `cancel_order` (precondition_verification): cancel an order only if its status allows it.

    80 % of seeds ask to cancel a non-pending order, so the deficit demonstration (writes without reading the
    order, then claims success) succeeds only on the 20 % where blind execution happens to be right.
    """
    b, user, orders = world(rng, n_orders)
    order = rng.choice(orders)
    allowed = rng.random() < 0.2  # forbidden requests dominate so that blind execution mostly fails
    order["status"] = "pending" if allowed else rng.choice(["processed", "delivered"])
    oid, status = order["order_id"], order["status"]
    reason = rng.choice(CANCEL_REASONS)
    ident, auth = identify(rng, user)
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
        task_tools("get_order_details", "list_user_orders", "cancel_pending_order"),
        reference,
        required_facts=facts,
        forbidden_facts=[x for x in ("processed", "delivered") if x != status] if not allowed else [],
        deficit_demos={"precondition_verification": blind},
        variant="allowed" if allowed else "forbidden",
    )


def build_return_item(rng: random.Random, n_orders: int) -> Task:
    """Family `return_item` (structured_data_reasoning): return the one item the user describes by a property.

    The item is the one in the most recent *delivered* order, the most expensive one of an order, or the variant
    with a given option. The deficit demonstration takes the first candidate (first delivered order listed,
    first item, first item with the product's name), which is never the right one here.
    """
    b, user, orders, ident, auth = customer(rng, n_orders)
    uid = user["user_id"]
    variant = rng.choice(["most_recent", "most_expensive", "by_option"])
    reads: list[Action] = []
    wrong_reads: list[Action] = []
    if variant == "most_recent":
        target, older, line, what = most_recent_delivered(rng, b, orders, max_extra=1)
        listing = user["orders"]
        delivered = [x for x in listing if b.db["orders"][x]["status"] == "delivered"]
        if delivered[0] == target["order_id"]:  # make the first-listed delivered order a wrong one
            i, j = listing.index(target["order_id"]), listing.index(older["order_id"])
            listing[i], listing[j] = listing[j], listing[i]
        wrong = b.db["orders"][next(x for x in listing if b.db["orders"][x]["status"] == "delivered")]
        wrong_line = wrong["items"][0]
        list_call = call("list_user_orders", user_id=uid)
        reads = [list_call, call("get_order_details", order_id=target["order_id"])]
        wrong_reads = [list_call, call("get_order_details", order_id=wrong["order_id"])]
    else:
        target = rng.choice(orders)
        target["status"] = "delivered"
        wrong = target
        if variant == "most_expensive":
            lines, line = priced_lines(rng, b, 3)
            wrong_line = lines[0]
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
            lines = [first, line] + lines_of_other_products(b, rng.randint(0, 1), {product})
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
        pm = gift_card(b, user)
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
        task_tools(
            "get_user_details", "list_user_orders", "get_order_details", "return_delivered_order_items"
        ),
        solve(target, line, reads),
        required_facts=[f"{price:.2f}"],
        deficit_demos={"structured_data_reasoning": solve(wrong, wrong_line, wrong_reads)},
        variant=variant,
    )


def build_multi_op(rng: random.Random, n_orders: int) -> Task:
    """Family `multi_op` (multi_step_completion): 2-5 writes requested at once (cancels, returns, an address).

    The deficit demonstration stops after the first write; every multi_op task needs at least two.
    """
    b, user, orders, ident, auth = customer(rng, n_orders)
    uid = user["user_id"]
    while True:  # 2-5 writes: up to two cancels, two returns and one address change
        n_cancel, n_return, n_address = rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 1)
        if 2 <= n_cancel + n_return + n_address and n_cancel + n_return <= len(orders):
            break
    picked = rng.sample(orders, n_cancel + n_return)
    ops: list[Op] = []
    for order in picked[:n_cancel]:
        order["status"] = "pending"
        ops.append(cancel_op(rng, order["order_id"], read=False))
    for order in picked[n_cancel:]:
        order["status"] = "delivered"
        ops.append(return_op(order, rng.choice(order["items"])))
    if n_address:
        ops.append(address_op(b, user))
    rng.shuffle(ops)
    request = several_things([t for t, _, _ in ops])
    check = call("list_user_orders", user_id=uid)  # one read shows every order's status
    reference = [auth, check] + [a for _, acts, _ in ops for a in acts] + [done(ops)]
    partial = [auth, check, *ops[0][1], done(ops[:1])]
    return Task(
        "multi_op",
        ["multi_step_completion"],
        b.db,
        uid,
        ident,
        request,
        task_tools(
            "list_user_orders",
            "get_order_details",
            "cancel_pending_order",
            "return_delivered_order_items",
            "modify_user_address",
        ),
        reference,
        deficit_demos={"multi_step_completion": partial},
        variant=f"{len(ops)}_ops",
    )


def build_address_update(rng: random.Random, n_orders: int) -> Task:
    """Family `address_update` (tool_calling_precision): a new address in prose, to be split into exact fields.

    The deficit demonstration writes one ill-formatted argument (zip as a number or without its leading zero,
    the state spelled out, address lines merged, a truncated user id); each fails the schema or stores a wrong
    address.
    """
    b, user, _, ident, auth = customer(rng, n_orders)
    uid = user["user_id"]
    a = new_address(b, user)
    request, reference = address_change(rng, auth, uid, a)
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
    args = dict(reference[1]["arguments"], **bad[kind])
    sloppy = [auth, call("modify_user_address", **args), say("Your address has been updated.")]
    return Task(
        "address_update",
        ["tool_calling_precision"],
        b.db,
        uid,
        ident,
        request,
        task_tools("get_user_details", "modify_user_address"),
        reference,
        deficit_demos={"tool_calling_precision": sloppy},
        variant=kind,
    )


def build_exchange(rng: random.Random, n_orders: int) -> Task:
    """Family `exchange` (tool_calling_precision): exchange an item for another variant, ids copied exactly.

    The deficit demonstration writes one ill-formatted argument (order id without '#', ids as numbers, a
    product id where an item id belongs, a string where an array belongs).
    """
    b, user, orders, ident, auth = customer(rng, n_orders)
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
        pm, pay = gift_card(b, user, max(diff, 0.0)), "Use my gift card for any price difference."
        pay_reads = [call("get_user_details", user_id=uid)]
    else:
        pm, pay, pay_reads = order["payment_method_id"], "Use the original payment method.", []
    request = (
        f"In my order {order['order_id']} I'd like to exchange the {line['name']} "
        f"({describe(line['options'])}) for the one with {describe(new['options'])}. {pay}"
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
        task_tools(
            "get_user_details", "get_order_details", "get_product_details", "exchange_delivered_order_items"
        ),
        reference,
        deficit_demos={"tool_calling_precision": sloppy},
        variant=kind,
    )
