"""Template `multi_step_completion`: carry 2-5 requested operations (cancels, returns, an address change) to the end.

Every operation is allowed (pending orders to cancel, delivered orders to return from, a fully spelled-out
address), so the only difficulty is doing all of them, each with exact arguments, before ending. Returns name
the product, so the agent reads the order to find the item id. Tasks follow the target's own multi-operation
requests (the shop's `multi_op` family): the same tools in the same order, the same numbered request, one
`list_user_orders` check after authenticating, cancels without reading the order (the check shows every status).
A one-operation task (the easy levels) is the same request with a single item.

Reward = fraction of the requested operations whose record ends exactly as the reference leaves it, halved
if anything else changed; success = every operation done and nothing else changed.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, call, scenario
from trace_cli.envs.worlds.tasks import (
    AUTH_TOOLS,
    ORDER_CHANGES,
    Op,
    address_op,
    cancel_op,
    done,
    return_op,
    several_things,
)

OPS = ("cancel", "return", "address")


class MultiStepCompletion(SyntheticEnv):
    capability = "multi_step_completion"
    description = "Several independent write operations requested at once; all must be completed."
    TOOLS = (*AUTH_TOOLS, "list_user_orders", "get_order_details", *ORDER_CHANGES, "modify_user_address")
    KNOBS = {
        "n_orders": Knob(int, 3, 10, doc="orders of the customer"),
        "min_ops": Knob(int, 1, 5, doc="fewest operations of a multi-step task"),
        "max_ops": Knob(int, 1, 5, doc="most operations per task"),
        "single_step_fraction": Knob(float, 0.0, 1.0, doc="probability of a task with a single operation"),
        "ops": Knob(list, choices=OPS, doc="operation kinds"),
    }
    # The two easiest levels add one easy extra operation to a single one the agent can do: a base with some
    # ability calibrates there (one cancel more; mostly single operations).
    LEVELS = [
        {"n_orders": 3, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.8, "ops": ["cancel"]},
        {"n_orders": 4, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.7, "ops": list(OPS)},
        {"n_orders": 4, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.6, "ops": list(OPS)},
        {"n_orders": 4, "min_ops": 2, "max_ops": 2, "single_step_fraction": 0.45, "ops": list(OPS)},
        {"n_orders": 5, "min_ops": 2, "max_ops": 3, "single_step_fraction": 0.3, "ops": list(OPS)},
        {"n_orders": 5, "min_ops": 2, "max_ops": 3, "single_step_fraction": 0.15, "ops": list(OPS)},
        {"n_orders": 6, "min_ops": 2, "max_ops": 4, "single_step_fraction": 0.0, "ops": list(OPS)},
        {"n_orders": 8, "min_ops": 3, "max_ops": 5, "single_step_fraction": 0.0, "ops": list(OPS)},
        {"n_orders": 10, "min_ops": 4, "max_ops": 5, "single_step_fraction": 0.0, "ops": list(OPS)},
    ]
    DEFAULT_LEVEL = 4  # (level 2 before the two easiest levels were added)
    WEIGHTS = {"operations": 1.0}

    @classmethod
    def shape(cls, profile: dict[str, Any]) -> dict[str, Any]:
        """The operations of the LACKING conversations' writes (an order operation among them: an address
        change alone is one operation); how many per task stays the levels' difficulty."""
        ops = [o for o in OPS if profile["kinds"].get(o)]
        return {"ops": ops} if any(o != "address" for o in ops) else {}

    def _validate_knobs(self) -> None:
        k = self.knobs
        if k["min_ops"] > k["max_ops"]:
            raise self._knob_error(f"min_ops ({k['min_ops']}) cannot exceed max_ops ({k['max_ops']})")
        order_ops = [o for o in k["ops"] if o != "address"]
        most = (k["n_orders"] if order_ops else 0) + ("address" in k["ops"])
        if k["max_ops"] > most:
            raise self._knob_error(
                f"max_ops ({k['max_ops']}) is more than the {most} operations "
                f"that n_orders={k['n_orders']} and ops={k['ops']} allow"
            )

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        c = self.customer(rng, k["n_orders"])
        uid = c.user["user_id"]
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
        picked = iter(rng.sample(c.orders, sum(1 for x in kinds if x != "address")))
        ops: list[Op] = []
        answers = [uid]
        targets: list[tuple[str, str]] = []
        for kind in kinds:
            if kind == "address":
                ops.append(address_op(c.b, c.user))
                targets.append(("users", uid))
                continue
            order = next(picked)
            targets.append(("orders", order["order_id"]))
            if kind == "cancel":
                order["status"] = "pending"
                ops.append(cancel_op(rng, order["order_id"], read=False))
            else:
                order["status"] = "delivered"
                line = rng.choice(order["items"])
                answers.append(line["item_id"])
                ops.append(return_op(order, line))
        request = several_things([t for t, _, _ in ops])
        check = call("list_user_orders", user_id=uid)  # one read shows every order's status
        reference = [c.auth, check] + [a for _, acts, _ in ops for a in acts] + [done(ops)]
        return scenario(c, request, reference, answers, variant=f"{len(ops)}_ops", data={"targets": targets})

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
