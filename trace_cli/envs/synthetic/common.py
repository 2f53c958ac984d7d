"""World-building helpers shared by the templates, on top of the shop's `WorldBuilder` (same data style)."""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.shop.world import WorldBuilder

ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled")
REASON_PHRASES = {
    "no longer needed": ["I no longer need it", "it is no longer needed"],
    "ordered by mistake": ["I ordered it by mistake", "it was ordered by mistake"],
}


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
) -> tuple[WorldBuilder, dict[str, Any], list[dict[str, Any]]]:
    """Products, the customer with `n_orders` dated orders (returned oldest first) and other customers."""
    b = WorldBuilder(rng)
    b.add_products(n_products)
    user = b.add_user()
    orders = [
        b.add_order(user, rng.choices(statuses, weights)[0], date=d) for d in b.distinct_dates(n_orders)
    ]
    rng.shuffle(user["orders"])  # listing order differs from date order
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


def identify(rng: random.Random, user: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The user's self-identification (email, or name + zip), as the shop phrases it, and the matching call."""
    n = user["name"]
    if rng.random() < 0.5:
        text = rng.choice(["Hi, my email is {e}.", "Hello, this is {e}.", "Hi! My email address is {e}."])
        return text.format(e=user["email"]), {
            "name": "find_user_id_by_email",
            "arguments": {"email": user["email"]},
        }
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
        {
            "name": "find_user_id_by_name_zip",
            "arguments": {"first_name": n["first_name"], "last_name": n["last_name"], "zip": z},
        },
    )


def lines_of_other_products(b: WorldBuilder, k: int, exclude: set[str]) -> list[dict[str, Any]]:
    out, seen = [], set(exclude)
    for _ in range(k):
        line = b.random_line(exclude_products=seen)
        seen.add(line["product_id"])
        out.append(line)
    return out


def gift_card(b: WorldBuilder, user: dict[str, Any], min_balance: float = 0.0) -> str:
    """The user's gift card id (created if missing)."""
    from trace_cli.envs.shop.world import money

    for pm, m in user["payment_methods"].items():
        if m["source"] == "gift_card":
            m["balance"] = max(m["balance"], money(min_balance + 10))
            return pm
    pm = f"gift_card_{b.digits(7)}"
    user["payment_methods"][pm] = {"source": "gift_card", "balance": money(max(min_balance + 10, 25))}
    return pm


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


def join_ops(texts: list[str]) -> str:
    if len(texts) == 1:
        return texts[0]
    return "; ".join(f"{i + 1}) {t}" for i, t in enumerate(texts))
