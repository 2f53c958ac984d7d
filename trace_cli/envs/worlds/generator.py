"""Procedural generation of a retail database (the shop's, and the draws under the τ²-retail world) (products, users, orders) from a `random.Random`.

The database is a plain JSON-compatible dict so that it can be deep-copied, compared for equality
(the reward compares final states exactly) and dumped into tool results:

  products: {product_id: {product_id, name, variants: {item_id: {item_id, options, price, available}}}}
  users:    {user_id: {user_id, name: {first_name, last_name}, email, address: {...},
                       payment_methods: {pm_id: {source, ...}}, orders: [order_id, ...]}}
  orders:   {order_id: {order_id, user_id, date, status, items: [{item_id, product_id, name, options,
                        price}], payment_method_id}}
"""

from __future__ import annotations

import random
from typing import Any

CANCEL_REASONS = ["no longer needed", "ordered by mistake"]  # the two reasons a retail order is cancelled for

# (name, price range, option dimensions as "dimension=value,value,...; ..."). Two option dimensions keep item
# descriptions short while still giving several variants per product; names are distinct so "the <name>"
# identifies a product.
_PRODUCTS: list[tuple[str, tuple[float, float], str]] = [
    ("T-Shirt", (12, 40), "color=blue,red,black,white; size=S,M,L,XL"),
    ("Running Shoes", (60, 180), "size=8,9,10,11; color=black,white,gray"),
    ("Water Bottle", (10, 45), "capacity=500ml,750ml,1000ml; material=steel,plastic,glass"),
    ("Desk Lamp", (20, 90), "color=black,white,silver; power=USB,AC,battery"),
    ("Backpack", (30, 150), "color=green,black,navy; size=small,medium,large"),
    ("Headphones", (40, 350), "type=over-ear,on-ear,in-ear; color=black,white,red"),
    ("Mechanical Keyboard", (50, 220), "switch=linear,tactile,clicky; layout=full,TKL,60%"),
    ("Coffee Maker", (25, 400), "type=drip,espresso,pour-over; capacity=4 cups,8 cups,12 cups"),
    ("Yoga Mat", (15, 80), "thickness=4mm,6mm,8mm; color=purple,blue,gray"),
    ("Smart Watch", (90, 450), "color=black,silver,gold; band=silicone,leather,metal"),
    ("Wireless Mouse", (12, 90), "color=black,white,gray; connectivity=USB,Bluetooth"),
    ("Jigsaw Puzzle", (10, 50), "pieces=500,1000,2000; theme=animals,art,landscape"),
    ("Tea Kettle", (20, 120), "material=steel,glass,ceramic; capacity=1L,1.5L,2L"),
    ("Sunglasses", (25, 250), "frame=metal,plastic,wood; lens=polarized,tinted,clear"),
    ("Bluetooth Speaker", (30, 200), "color=black,blue,red; battery=10h,20h"),
    ("Office Chair", (90, 500), "material=mesh,leather,fabric; color=black,gray,blue"),
]
CATALOGUE: list[tuple[str, dict[str, list[str]], tuple[float, float]]] = [
    (name, {k: v.split(",") for k, v in (d.split("=") for d in dims.split("; "))}, prices)
    for name, prices, dims in _PRODUCTS
]

FIRST_NAMES = [
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lena",
    "Mei",
    "Noah",
    "Omar",
    "Priya",
    "Raj",
    "Sara",
    "Tom",
    "Uma",
    "Yusuf",
    "Zoe",
]
LAST_NAMES = [
    "Lee",
    "Garcia",
    "Kim",
    "Rossi",
    "Patel",
    "Silva",
    "Nguyen",
    "Moore",
    "Khan",
    "Ito",
    "Lopez",
    "Novak",
    "Brown",
    "Sato",
    "Haddad",
    "Kovacs",
]
# (city, state, zip prefix): some prefixes start with '0' so zips test string handling of leading zeros.
CITIES = [
    ("Austin", "TX", "787"), ("Boston", "MA", "021"), ("Newark", "NJ", "071"), ("Denver", "CO", "802"),
    ("Seattle", "WA", "981"), ("Portland", "ME", "041"), ("Chicago", "IL", "606"), ("Hartford", "CT", "061"),
    ("Phoenix", "AZ", "850"), ("Miami", "FL", "331"), ("Burlington", "VT", "054"), ("Columbus", "OH", "432"),
]  # fmt: skip
STREETS = [
    "Elm Street",
    "Oak Avenue",
    "Maple Drive",
    "Cedar Lane",
    "Park Road",
    "Lake Street",
    "Hill Road",
    "River Drive",
    "Pine Court",
    "Main Street",
    "Sunset Boulevard",
    "Willow Way",
]
CARD_BRANDS = ["visa", "mastercard", "amex"]


def money(x: float) -> float:
    """Round to cents; every amount in the database goes through this so sums compare exactly."""
    return round(x + 1e-9, 2)


class WorldBuilder:
    """Creates unique ids and database records from one random stream (never the global one)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()
        self.db: dict[str, Any] = {"products": {}, "users": {}, "orders": {}}

    # -- ids -------------------------------------------------------------------------------------------
    def _unique(self, make) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def digits(self, n: int) -> str:
        return self._unique(lambda: str(self.rng.randint(10 ** (n - 1), 10**n - 1)))

    def order_id(self) -> str:
        return self._unique(lambda: f"#W{self.rng.randint(1_000_000, 9_999_999)}")

    # -- products --------------------------------------------------------------------------------------
    def add_products(self, n: int) -> None:
        for name, dims, (lo, hi) in self.rng.sample(CATALOGUE, n):
            pid = self.digits(10)
            combos = [{}]
            for key, values in dims.items():
                combos = [dict(c, **{key: v}) for c in combos for v in values]
            variants = {}
            n_variants = 3 if self.rng.random() < 0.7 else 4  # few variants keep product listings short
            for options in self.rng.sample(combos, min(len(combos), n_variants)):
                iid = self.digits(10)
                variants[iid] = {
                    "item_id": iid,
                    "options": options,
                    "price": money(self.rng.uniform(lo, hi)),
                    "available": self.rng.random() < 0.8,
                }
            self.db["products"][pid] = {"product_id": pid, "name": name, "variants": variants}

    def random_line(
        self, product_id: str | None = None, exclude_products: set[str] = frozenset()
    ) -> dict[str, Any]:
        """One order line (an item of some product) copied from the catalogue."""
        if product_id is None:
            product_id = self.rng.choice([p for p in self.db["products"] if p not in exclude_products])
        product = self.db["products"][product_id]
        variant = self.rng.choice(list(product["variants"].values()))
        return self.line(product_id, variant["item_id"])

    def line(self, product_id: str, item_id: str) -> dict[str, Any]:
        product = self.db["products"][product_id]
        v = product["variants"][item_id]
        return {
            "item_id": item_id,
            "product_id": product_id,
            "name": product["name"],
            "options": dict(v["options"]),
            "price": v["price"],
        }

    # -- users -----------------------------------------------------------------------------------------
    def random_address(self) -> dict[str, str]:
        city, state, prefix = self.rng.choice(CITIES)
        address2 = self.rng.choice(
            [
                "",
                "",
                f"Apt {self.rng.randint(1, 40)}{self.rng.choice('ABCD')}",
                f"Suite {self.rng.randint(100, 999)}",
            ]
        )
        return {
            "address1": f"{self.rng.randint(1, 9999)} {self.rng.choice(STREETS)}",
            "address2": address2,
            "city": city,
            "state": state,
            "country": "USA",
            "zip": f"{prefix}{self.rng.randint(0, 99):02d}",
        }

    def add_user(self, first: str | None = None, last: str | None = None) -> dict[str, Any]:
        first = first or self.rng.choice(FIRST_NAMES)
        last = last or self.rng.choice(LAST_NAMES)
        uid = self._unique(lambda: f"{first.lower()}_{last.lower()}_{self.rng.randint(1000, 9999)}")
        methods: dict[str, dict[str, Any]] = {}
        kinds = self.rng.sample(["credit_card", "paypal", "gift_card"], self.rng.randint(1, 3))
        if "credit_card" not in kinds and "paypal" not in kinds:
            kinds.append("credit_card")  # every user can pay for an order with a non-gift-card method
        for kind in kinds:
            pm = f"{kind}_{self.digits(7)}"
            if kind == "credit_card":
                methods[pm] = {
                    "source": "credit_card",
                    "brand": self.rng.choice(CARD_BRANDS),
                    "last_four": f"{self.rng.randint(0, 9999):04d}",
                }
            elif kind == "gift_card":
                methods[pm] = {"source": "gift_card", "balance": money(self.rng.uniform(0, 300))}
            else:
                methods[pm] = {"source": "paypal"}
        user = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "email": f"{first.lower()}.{last.lower()}{self.rng.randint(10, 9999)}@example.com",
            "address": self.random_address(),
            "payment_methods": methods,
            "orders": [],
        }
        self.db["users"][uid] = user
        return user

    # -- orders ----------------------------------------------------------------------------------------
    def add_order(
        self,
        user: dict[str, Any],
        status: str,
        lines: list[dict[str, Any]] | None = None,
        date: str | None = None,
        payment_method_id: str | None = None,
    ) -> dict[str, Any]:
        oid = self.order_id()
        if lines is None:
            lines = []
            seen: set[str] = set()
            for _ in range(1 if self.rng.random() < 0.5 else 2):  # 1-2 lines keep tool results short
                line = self.random_line(exclude_products=seen)
                seen.add(line["product_id"])
                lines.append(line)
        if payment_method_id is None:
            # Orders are paid with a card or PayPal (gift cards only receive refunds here), which keeps
            # "the original payment method" distinct from "my gift card".
            payment_method_id = self.rng.choice(
                [pm for pm, m in user["payment_methods"].items() if m["source"] != "gift_card"]
            )
        order = {
            "order_id": oid,
            "user_id": user["user_id"],
            "date": date or f"2024-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}",
            "status": status,
            "items": lines,
            "payment_method_id": payment_method_id,
        }
        self.db["orders"][oid] = order
        user["orders"].append(oid)
        return order

    def distinct_dates(self, n: int) -> list[str]:
        """n distinct dates in 2024, sorted ascending (so callers can say which order is most recent)."""
        days = sorted(self.rng.sample(range(1, 336), n))
        out = []
        for d in days:
            month, day = divmod(d - 1, 28)
            out.append(f"2024-{month + 1:02d}-{day + 1:02d}")
        return out


def order_total(order: dict[str, Any]) -> float:
    return money(sum(line["price"] for line in order["items"]))
