"""Tasks of `shop-mixed`: one conversation with 1-4 requests, all of which must be right (τ²-bench's task structure).

τ²-bench's tasks are not isolated skills: one call often asks for several things, some of them must be refused,
and a failure usually lacks more than one capability. `shop-mixed` draws its task mix from the figures counted in
the τ²-bench tasks vendored in `examples/tau2/` (retail 114 + airline 50 = 164 tasks; a "write" is a
state-changing call of the task's reference actions; "requests" = max(1, writes), a task without a write being
one request that is refused or only answered):

  figure (τ²-bench retail+airline, vendored)        τ²-bench    shop-mixed (2,000 seeds, `mixed_task_figures`)
  requests per task 1 / 2 / 3 / 4+                  .65/.18/.12/.05    drawn with these weights (`REQUESTS`)
  writes per task, mean                             1.37        1.33 (test: within 0.15)
  tasks with no write (refused or read-only)        0.21        0.17 (test: within 0.06)
  tasks with >= 2 writes                            0.35        0.32 (test: within 0.06)
  orders of the customer (records to choose among)  3.1 (1-6)    5 (`n_orders`)

(`tests/envs/test_shop_mixed.py` recounts both columns.) A task of one request is one of the shop's own tasks
(`order_status`, `cancel_order`, `return_item`, `address_update`, `exchange`: same text, same checks), so the
base agent meets single requests exactly as it learnt them. A task of k >= 2 requests (family `mixed<k>`) puts k
operations on one customer's orders: `status` (report an order's status and total), `cancel` (allowed only when
the order is pending; otherwise refused, saying its status), `return` (the most expensive item of a delivered
order: a choice among the order's records), `address` (a new address in prose, to be split into exact fields).
Success is all-or-nothing: the final database must equal the reference's and every required fact must be said.
Each task's hidden `capabilities` are the union of its operations' needs, plus multi_step_completion when it
has >= 2 writes; each capability has a deficit demonstration (that capability's operations done wrongly, or, for
multi-step, stopping after the first write).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_cli.envs.shop.tasks.common import (
    REASON_PHRASES,
    STATE_NAMES,
    Action,
    Task,
    address_text,
    call,
    customer,
    new_address,
    numbered,
    priced_lines,
    say,
    task_tools,
)
from trace_cli.envs.shop.tasks.families import (
    build_address_update,
    build_cancel_order,
    build_exchange,
    build_order_status,
    build_return_item,
)
from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.shop.world import order_total

# Requests per task, from the vendored τ²-bench tasks (max(1, writes), capped at 4): 107, 29, 20, 8 of 164.
REQUESTS = {1: 107, 2: 29, 3: 20, 4: 8}
# A one-request task is one of the shop's own families (multi_op is itself several requests).
SINGLE: dict[str, Callable[[random.Random, int], Task]] = {
    "order_status": build_order_status,
    "cancel_order": build_cancel_order,
    "return_item": build_return_item,
    "address_update": build_address_update,
    "exchange": build_exchange,
}
SINGLE_WEIGHTS = {"order_status": 1, "cancel_order": 3, "return_item": 4, "address_update": 2, "exchange": 2}
# The operations of a several-request task, and how often each is drawn.
# tau2-bench's several-request tasks nearly all write (its 35 % of tasks with >= 2 requests and 35 % with >= 2
# writes are the same tasks): a read-only request is rare among them, and so is a refused cancel.
OPERATIONS = {"status": 0.25, "cancel": 3, "return": 4, "address": 2}
P_CANCEL_REFUSED = 0.15  # share of cancel requests on a non-pending order (to be refused)

MIXED_TOOLS = (
    "get_user_details",
    "list_user_orders",
    "get_order_details",
    "cancel_pending_order",
    "return_delivered_order_items",
    "modify_user_address",
)


@dataclass
class MixedOp:
    """One request of a several-request task: what the user asks, how it is done, what must be said."""

    kind: str
    text: str
    actions: list[Action]
    report: str
    facts: list[str] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    deficit: dict[str, list[Action]] = field(default_factory=dict)  # capability -> its wrong actions
    deficit_report: dict[str, str] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return sum(1 for a in self.actions if a.get("name") in WRITES)


WRITES = ("cancel_pending_order", "return_delivered_order_items", "modify_user_address")


def op_status(order: dict[str, Any]) -> MixedOp:
    oid, status, total = order["order_id"], order["status"], order_total(order)
    return MixedOp(
        "status",
        f"tell me the status and the total of order {oid}",
        [call("get_order_details", order_id=oid)],
        f"order {oid} is {status} and its total is {total:.2f} dollars",
        facts=[status, f"{total:.2f}"],
    )


def op_cancel(rng: random.Random, order: dict[str, Any]) -> MixedOp:
    refused = rng.random() < P_CANCEL_REFUSED
    order["status"] = rng.choice(["processed", "delivered"]) if refused else "pending"
    oid, status = order["order_id"], order["status"]
    reason = rng.choice(CANCEL_REASONS)
    text = f"cancel order {oid} ({rng.choice(REASON_PHRASES[reason])})"
    read = call("get_order_details", order_id=oid)
    blind = [call("cancel_pending_order", order_id=oid, reason=reason)]
    if refused:
        return MixedOp(
            "cancel_refused",
            text,
            [read],
            f"order {oid} is {status}, so it cannot be cancelled (only pending orders can)",
            facts=[status],
            capabilities=["precondition_verification"],
            deficit={"precondition_verification": blind},
            deficit_report={"precondition_verification": f"order {oid} is cancelled"},
        )
    return MixedOp(
        "cancel",
        text,
        [read, *blind],
        f"order {oid} is cancelled",
        capabilities=["precondition_verification"],
        deficit={"precondition_verification": blind},
    )


def op_return(rng: random.Random, b: Any, order: dict[str, Any]) -> MixedOp:
    order["status"] = "delivered"
    lines, line = priced_lines(rng, b, rng.choice([2, 3]))
    order["items"] = lines
    oid, pm = order["order_id"], order["payment_method_id"]

    def ret(item: dict[str, Any]) -> list[Action]:
        return [
            call("get_order_details", order_id=oid),
            call(
                "return_delivered_order_items",
                order_id=oid,
                item_ids=[item["item_id"]],
                payment_method_id=pm,
            ),
        ]

    return MixedOp(
        "return",
        f"return the most expensive item of order {oid} to the original payment method",
        ret(line),
        f"the return of the {line['name']} from order {oid} is requested ({line['price']:.2f} dollars back)",
        facts=[f"{line['price']:.2f}"],
        capabilities=["structured_data_reasoning"],
        deficit={"structured_data_reasoning": ret(lines[0])},
        deficit_report={"structured_data_reasoning": f"the return from order {oid} is requested"},
    )


def op_address(rng: random.Random, b: Any, user: dict[str, Any]) -> MixedOp:
    a = new_address(b, user)
    uid = user["user_id"]
    bad = dict(a, zip=int(a["zip"])) if rng.random() < 0.5 else dict(a, state=STATE_NAMES[a["state"]])
    return MixedOp(
        "address",
        f"change my default address to {address_text(a)}",
        [call("modify_user_address", user_id=uid, **a)],
        "your default address is updated",
        capabilities=["tool_calling_precision"],
        deficit={"tool_calling_precision": [call("modify_user_address", user_id=uid, **bad)]},
    )


def build_mixed(rng: random.Random, n_requests: int, n_orders: int) -> Task:
    """A task of `n_requests` >= 2 operations on one customer's orders (at most one address change)."""
    b, user, orders, ident, auth = customer(rng, n_orders)
    while True:
        kinds = rng.choices(list(OPERATIONS), weights=list(OPERATIONS.values()), k=n_requests)
        if kinds.count("address") <= 1:
            break
    picked = rng.sample(orders, sum(k != "address" for k in kinds))
    ops: list[MixedOp] = []
    for kind in kinds:
        if kind == "address":
            ops.append(op_address(rng, b, user))
            continue
        order = picked.pop()
        if kind == "status":
            ops.append(op_status(order))
        elif kind == "cancel":
            ops.append(op_cancel(rng, order))
        else:
            ops.append(op_return(rng, b, order))
    request = "I need several things done: " + numbered([op.text for op in ops]) + "."

    def close(done: list[MixedOp], reports: dict[int, str] | None = None) -> Action:
        reports = reports or {}
        return say("Done: " + "; ".join(reports.get(i, op.report) for i, op in enumerate(done)) + ".")

    reference = [auth, *(a for op in ops for a in op.actions), close(ops)]
    caps = sorted({c for op in ops for c in op.capabilities})
    deficits: dict[str, list[Action]] = {}
    for cap in caps:
        acts = [a for op in ops for a in op.deficit.get(cap, op.actions)]
        reports = {i: op.deficit_report[cap] for i, op in enumerate(ops) if cap in op.deficit_report}
        deficits[cap] = [auth, *acts, close(ops, reports)]
    n_writes = sum(op.writes for op in ops)
    if n_writes >= 2:
        caps.append("multi_step_completion")
        first = next(i for i, op in enumerate(ops) if op.writes)
        deficits["multi_step_completion"] = [
            auth,
            *(a for op in ops[: first + 1] for a in op.actions),
            close(ops[: first + 1]),
        ]
    return Task(
        f"mixed{n_requests}",
        caps,
        b.db,
        user["user_id"],
        ident,
        request,
        task_tools(*MIXED_TOOLS),
        reference,
        required_facts=sorted({f for op in ops for f in op.facts}),
        deficit_demos=deficits,
        variant="+".join(op.kind for op in ops),
    )


def build_task(seed: int, n_orders: int) -> Task:
    """The `shop-mixed` task of a seed: the number of requests, then a shop family or several operations."""
    rng = random.Random(f"shop-mixed:{seed}")
    k = rng.choices(list(REQUESTS), weights=list(REQUESTS.values()))[0]
    if k == 1:
        fam = rng.choices(list(SINGLE_WEIGHTS), weights=list(SINGLE_WEIGHTS.values()))[0]
        return SINGLE[fam](rng, n_orders)
    return build_mixed(rng, k, n_orders)


def task_figures(tasks: list[Task]) -> dict[str, float]:
    """The figures the docstring compares with τ²-bench's: requests, writes, refusals of a list of tasks."""
    n = len(tasks)
    every_write = (*WRITES, "exchange_delivered_order_items")
    writes = [sum(1 for a in t.reference if a.get("name") in every_write) for t in tasks]
    requests = [int(t.family[len("mixed") :]) if t.family.startswith("mixed") else 1 for t in tasks]
    return {
        "tasks": n,
        **{f"requests_{k}": round(sum(r == k for r in requests) / n, 3) for k in (1, 2, 3, 4)},
        "writes_mean": round(sum(writes) / n, 3),
        "no_write": round(sum(w == 0 for w in writes) / n, 3),
        "two_or_more_writes": round(sum(w >= 2 for w in writes) / n, 3),
    }
