"""Template `multi_step_completion`: carry 2-5 requested operations (cancels, returns, an address change) to the end.

Every operation is allowed (pending orders to cancel, delivered orders to return from, a fully spelled-out
address), so the only difficulty is doing all of them, each with exact arguments, before ending. Returns name
the product, so the agent reads the order to find the item id.

Reward = fraction of the requested operations whose record ends exactly as the reference leaves it, halved
if anything else changed; success = every operation done and nothing else changed.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, call, say
from trace_cli.envs.synthetic.common import REASON_PHRASES, identify, join_ops, new_address, world
from trace_cli.errors import UsageError

OPS = ("cancel", "return", "address")


class MultiStepCompletion(SyntheticEnv):
    capability = "multi_step_completion"
    description = "Several independent write operations requested at once; all must be completed."
    TOOLS = (
        "find_user_id_by_email",
        "find_user_id_by_name_zip",
        "get_order_details",
        "cancel_pending_order",
        "return_delivered_order_items",
        "modify_user_address",
    )
    KNOBS = {
        "n_orders": Knob(int, 3, 10, doc="orders of the customer"),
        "min_ops": Knob(int, 1, 5, doc="fewest operations of a multi-step task"),
        "max_ops": Knob(int, 1, 5, doc="most operations per task"),
        "single_step_fraction": Knob(float, 0.0, 1.0, doc="probability of a task with a single operation"),
        "ops": Knob(list, choices=OPS, doc="operation kinds"),
    }
    LEVELS = [
        {"n_orders": 4, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.6, "ops": list(OPS)},
        {"n_orders": 4, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.45, "ops": list(OPS)},
        {"n_orders": 5, "min_ops": 2, "max_ops": 3, "single_step_fraction": 0.3, "ops": list(OPS)},
        {"n_orders": 5, "min_ops": 2, "max_ops": 3, "single_step_fraction": 0.15, "ops": list(OPS)},
        {"n_orders": 6, "min_ops": 2, "max_ops": 4, "single_step_fraction": 0.0, "ops": list(OPS)},
        {"n_orders": 8, "min_ops": 3, "max_ops": 5, "single_step_fraction": 0.0, "ops": list(OPS)},
        {"n_orders": 10, "min_ops": 4, "max_ops": 5, "single_step_fraction": 0.0, "ops": list(OPS)},
    ]
    WEIGHTS = {"operations": 1.0}

    def _validate_knobs(self) -> None:
        k = self.knobs
        if k["min_ops"] > k["max_ops"]:
            raise UsageError(
                f"{self.capability}: min_ops ({k['min_ops']}) cannot exceed max_ops ({k['max_ops']})"
            )
        order_ops = [o for o in k["ops"] if o != "address"]
        most = (k["n_orders"] if order_ops else 0) + ("address" in k["ops"])
        if k["max_ops"] > most:
            raise UsageError(
                f"{self.capability}: max_ops ({k['max_ops']}) is more than the {most} operations "
                f"that n_orders={k['n_orders']} and ops={k['ops']} allow"
            )

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        b, user, orders = world(rng, k["n_orders"])
        ident, auth = identify(rng, user)
        uid = user["user_id"]
        if rng.random() < k["single_step_fraction"]:
            n_ops = 1
        else:
            n_ops = rng.randint(max(k["min_ops"], 1), k["max_ops"])
        order_kinds = [o for o in k["ops"] if o != "address"]
        kinds: list[str] = []
        if "address" in k["ops"] and (not order_kinds or rng.random() < 0.35):
            kinds.append("address")
        while len(kinds) < n_ops:
            kinds.append(rng.choice(order_kinds))
        rng.shuffle(kinds)
        picked = iter(rng.sample(orders, sum(1 for x in kinds if x != "address")))
        ops: list[tuple[str, list[dict[str, Any]], str]] = []  # (request text, actions, report)
        answers = [uid]
        targets: list[tuple[str, str]] = []
        for kind in kinds:
            if kind == "address":
                a = new_address(b, user)
                text = (
                    f"change my default address to address1 '{a['address1']}', address2 '{a['address2']}', "
                    f"city '{a['city']}', state '{a['state']}', country '{a['country']}', zip '{a['zip']}'"
                )
                ops.append(
                    (text, [call("modify_user_address", user_id=uid, **a)], "your default address is updated")
                )
                targets.append(("users", uid))
                continue
            order = next(picked)
            oid = order["order_id"]
            targets.append(("orders", oid))
            if kind == "cancel":
                order["status"] = "pending"
                reason = rng.choice(CANCEL_REASONS)
                ops.append(
                    (
                        f"cancel order {oid} ({rng.choice(REASON_PHRASES[reason])})",
                        [
                            call("get_order_details", order_id=oid),
                            call("cancel_pending_order", order_id=oid, reason=reason),
                        ],
                        f"order {oid} is cancelled",
                    )
                )
            else:
                order["status"] = "delivered"
                line = rng.choice(order["items"])
                answers.append(line["item_id"])
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
        if len(ops) == 1:
            request = f"Please {ops[0][0]}."
        else:
            request = "I need several things done: " + join_ops([t for t, _, _ in ops]) + "."
        reference = [auth] + [a for _, acts, _ in ops for a in acts]
        reference.append(say("Done: " + "; ".join(r for _, _, r in ops) + "."))
        return Scenario(
            b.db,
            uid,
            ident,
            request,
            reference,
            answers,
            variant=f"{len(ops)}_ops",
            data={"targets": targets},
        )

    def grade(self) -> tuple[dict[str, float], dict[str, Any]]:
        targets = [tuple(t) for t in self._scenario.data["targets"]]
        done = [t for t in targets if self.matches_target(*t)]
        expected = {("users", k) for k in self.changed("users")} | {
            ("orders", k) for k in self.changed("orders")
        }
        collateral = sorted(f"{t}/{k}" for t, k in expected - set(targets))
        frac = len(done) / len(targets)
        if collateral:
            frac *= 0.5
        return (
            {"operations": frac},
            {
                "done": [f"{t}/{k}" for t, k in done],
                "missing": [f"{t}/{k}" for t, k in targets if (t, k) not in done],
                "collateral": collateral,
            },
        )
