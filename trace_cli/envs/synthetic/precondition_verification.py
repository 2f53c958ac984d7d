"""Template `precondition_verification`: read an order's status before changing it, and refuse when policy forbids.

The user asks to cancel or return items of 1-3 orders. Each request is allowed or forbidden by the order's
status (cancel: only pending; return: only delivered), which the agent learns only by reading the order — the
request never states it. Forbidden requests dominate by default, so writing blindly mostly fails.

Reward = 0.6·action + 0.4·communicate, where per request action = 0.5·verified (the order was read before any
write attempt on it) + 0.5·(verified and the final order record is right and no forbidden write was attempted);
communicate = the refused order's status / the refund amount of an allowed one appears in the agent's
messages (0 if a wrong status does). Success = all of it. On the easy levels (`verify_allowed` 0) an allowed
request is judged on its outcome only, as in the shop's cancel_order family; refusals always need the read.
"""

from __future__ import annotations

import random
from typing import Any

from trace_cli.envs.synthetic.base import Knob, Scenario, SyntheticEnv, scenario
from trace_cli.envs.synthetic.shaping import share
from trace_cli.envs.worlds.generator import CANCEL_REASONS, order_total
from trace_cli.envs.worlds.tasks import (
    AUTH_TOOLS,
    ORDER_CHANGES,
    REASON_PHRASES,
    call,
    join_ops,
    say,
)

ALLOWED_STATUS = {"cancel": "pending", "return": "delivered"}
FORBIDDEN_STATUSES = {"cancel": ("processed", "delivered"), "return": ("pending", "processed")}


class PreconditionVerification(SyntheticEnv):
    capability = "precondition_verification"
    description = (
        "Cancel/return requests whose permission depends on the order status, which only a read "
        "reveals; the agent must verify first and refuse forbidden requests without writing."
    )
    TOOLS = (*AUTH_TOOLS, "get_order_details", *ORDER_CHANGES)
    KNOBS = {
        "n_orders": Knob(int, 2, 10, doc="orders of the customer (distractors)"),
        "n_requests": Knob(int, 1, 3, doc="requests (orders to change) per task"),
        "forbidden_fraction": Knob(
            float, 0.0, 1.0, doc="probability that a request is forbidden by the status"
        ),
        "return_fraction": Knob(
            float, 0.0, 1.0, doc="probability that a request is a return (else a cancel)"
        ),
        "verify_allowed": Knob(
            int,
            0,
            1,
            doc="1: an allowed request also needs the read before the write (and the "
            "refund amount told); 0: only refusals are judged on verification, "
            "as in the shop's cancel_order family",
        ),
    }
    LEVELS = [
        {
            "n_orders": 3,
            "n_requests": 1,
            "forbidden_fraction": 0.2,
            "return_fraction": 0.0,
            "verify_allowed": 0,
        },
        {
            "n_orders": 4,
            "n_requests": 1,
            "forbidden_fraction": 0.35,
            "return_fraction": 0.2,
            "verify_allowed": 0,
        },
        {
            "n_orders": 5,
            "n_requests": 1,
            "forbidden_fraction": 0.5,
            "return_fraction": 0.4,
            "verify_allowed": 0,
        },
        {
            "n_orders": 5,
            "n_requests": 1,
            "forbidden_fraction": 0.6,
            "return_fraction": 0.5,
            "verify_allowed": 1,
        },
        {
            "n_orders": 6,
            "n_requests": 2,
            "forbidden_fraction": 0.6,
            "return_fraction": 0.5,
            "verify_allowed": 1,
        },
        {
            "n_orders": 8,
            "n_requests": 2,
            "forbidden_fraction": 0.7,
            "return_fraction": 0.5,
            "verify_allowed": 1,
        },
        {
            "n_orders": 10,
            "n_requests": 3,
            "forbidden_fraction": 0.7,
            "return_fraction": 0.5,
            "verify_allowed": 1,
        },
    ]
    WEIGHTS = {"action": 0.6, "communicate": 0.4}

    @classmethod
    def shape(cls, profile: dict[str, Any]) -> dict[str, Any]:
        """The refusal share and the returns among the cancel/return requests of the LACKING conversations."""
        kinds, refused = profile["kinds"], profile["refused"]
        requests = kinds.get("cancel", 0) + kinds.get("return", 0) + refused
        if not requests:
            return {}
        return {
            "forbidden_fraction": share(refused, requests),
            "return_fraction": share(kinds.get("return", 0), requests, 0.0),
        }

    def _validate_knobs(self) -> None:
        k = self.knobs
        if k["n_requests"] > k["n_orders"]:
            raise self._knob_error(f"n_requests ({k['n_requests']}) cannot exceed n_orders ({k['n_orders']})")

    def build(self, rng: random.Random) -> Scenario:
        k = self.knobs
        c = self.customer(rng, k["n_orders"])
        reqs: list[dict[str, Any]] = []
        for order in rng.sample(c.orders, k["n_requests"]):
            kind = "return" if rng.random() < k["return_fraction"] else "cancel"
            allowed = rng.random() >= k["forbidden_fraction"]
            order["status"] = ALLOWED_STATUS[kind] if allowed else rng.choice(FORBIDDEN_STATUSES[kind])
            reqs.append(
                {
                    "kind": kind,
                    "allowed": allowed,
                    "order": order,
                    "line": rng.choice(order["items"]),
                    "reason": rng.choice(CANCEL_REASONS),
                }
            )
        single = len(reqs) == 1
        texts, reference, report, facts, answers = [], [c.auth], [], [], [c.user["user_id"]]
        for r in reqs:
            o = r["order"]
            oid, status = o["order_id"], o["status"]
            answers.append(status)
            if r["kind"] == "cancel":
                phrase = rng.choice(REASON_PHRASES[r["reason"]])
                if single:
                    texts.append(
                        rng.choice(
                            [
                                "Please cancel my order {o}; {r}.",
                                "I want to cancel order {o} because {r}.",
                                "Could you cancel order {o}? {R}.",
                            ]
                        ).format(o=oid, r=phrase, R=phrase[0].upper() + phrase[1:])
                    )
                else:
                    texts.append(f"cancel order {oid} ({phrase})")
            else:
                name = r["line"]["name"]
                if single:
                    texts.append(
                        rng.choice(
                            [
                                "Please return the {p} from my order {o} and refund it to the original payment method.",
                                "I want to return the {p} I got in order {o}; refund to the original payment method.",
                            ]
                        ).format(p=name, o=oid)
                    )
                else:
                    texts.append(f"return the {name} from order {oid} to the original payment method")
            reference.append(call("get_order_details", order_id=oid))
            if r["allowed"] and r["kind"] == "cancel":
                total = order_total(o)
                reference.append(call("cancel_pending_order", order_id=oid, reason=r["reason"]))
                report.append(f"order {oid} is cancelled and {total:.2f} dollars will be refunded")
                answers.append(f"{total:.2f}")
                if k["verify_allowed"]:  # the amount is known only after reading the order
                    facts.append(f"{total:.2f}")
            elif r["allowed"]:
                line = r["line"]
                reference.append(
                    call(
                        "return_delivered_order_items",
                        order_id=oid,
                        item_ids=[line["item_id"]],
                        payment_method_id=o["payment_method_id"],
                    )
                )
                report.append(
                    f"the return of the {line['name']} from order {oid} is requested and you will get "
                    f"{line['price']:.2f} dollars back"
                )
                facts.append(f"{line['price']:.2f}")
                answers.append(f"{line['price']:.2f}")
            else:
                rule = (
                    "only pending orders can be cancelled"
                    if r["kind"] == "cancel"
                    else "only delivered orders can be returned"
                )
                report.append(
                    f"order {oid} is {status}, so it cannot be "
                    f"{'cancelled' if r['kind'] == 'cancel' else 'returned'}: {rule}"
                )
                facts.append(status)
        if single:
            request = texts[0]
        else:
            request = "I need a few things: " + join_ops(texts) + "."
        text = "; ".join(report)
        text = text[0].upper() + text[1:] + "."
        reference.append(say(("Sorry. " + text) if any(not r["allowed"] for r in reqs) else text))
        forbidden: list[str] = []
        if single and not reqs[0]["allowed"]:
            kind = reqs[0]["kind"]
            forbidden = [s for s in FORBIDDEN_STATUSES[kind] if s != reqs[0]["order"]["status"]]
        variant = "+".join(f"{r['kind']}_{'allowed' if r['allowed'] else 'forbidden'}" for r in reqs)
        data = {
            "requests": [
                {"order_id": r["order"]["order_id"], "kind": r["kind"], "allowed": r["allowed"]} for r in reqs
            ]
        }
        return scenario(c, request, reference, answers, facts, forbidden, variant, data)

    def grade(self) -> tuple[dict[str, float], dict[str, Any]]:
        reqs = self._scenario.data["requests"]
        per, details = [], []
        requested = {r["order_id"] for r in reqs}
        collateral = sorted((self.changed("orders") - requested) | self.changed("users"))
        for r in reqs:
            oid = r["order_id"]
            verified = self.read_before_write(oid)
            attempts = self.write_attempts(oid)
            forbidden_attempt = bool(attempts) and not r["allowed"]
            if r["allowed"] and not self.knobs["verify_allowed"]:
                verified = verified or self.matches_target("orders", oid)  # only the outcome is judged
            outcome = verified and not forbidden_attempt and self.matches_target("orders", oid)
            per.append(0.5 * verified + 0.5 * outcome)
            details.append(
                {
                    "order_id": oid,
                    "verified": verified,
                    "forbidden_attempt": forbidden_attempt,
                    "outcome": outcome,
                }
            )
        action = sum(per) / len(per)
        if collateral:
            action *= 0.5
        comm, missing, wrong = self.communicate()
        if (
            not self._scenario.required_facts
        ):  # nothing to tell (an allowed cancel): credit only a finished job
            comm *= float(all(d["outcome"] for d in details) and not collateral)
        return (
            {"action": action, "communicate": comm},
            {"requests": details, "collateral": collateral, "missing_facts": missing, "wrong_facts": wrong},
        )
