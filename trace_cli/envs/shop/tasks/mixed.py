"""Tasks of `shop-mixed`: one conversation with 1-4 requests, all of which must be right (τ²-bench's task structure).

τ²-bench's tasks are not isolated skills: nearly every task needs lookups, a policy check and exact arguments
together, some requests must be refused, and the user reveals a further request only once the previous one is
handled. `shop-mixed` is drawn to match the figures counted (by `needs_figures`, applied to each task's reference
actions) in the τ²-bench tasks vendored in `examples/tau2/` (retail 114 + airline 50 = 164 tasks). A "write" is
a state-changing call (`EVERY_WRITE`); a task's needs (`needs`) are `refusal` (no write: refused or only
answered), `lookup` (a lookup before the first write), `exact_ids` (a write with item ids, flights, passengers
or an address's fields) and `several_writes` (>= 2 writes):

  figure (share of tasks)                          τ²-bench (164)   shop-mixed (seeds 0-1999)
  two or more needs                                0.58             0.59
  single-request tasks (< 2 writes) with >= 2      0.38             0.39
  refusals (no write)                              0.21             0.21
  lookups before a write                           0.42             0.41
  exact item ids / address fields in a write       0.71             0.73
  requests revealed in turn (>= 2 requests)        0.35             0.35

(`tests/envs/test_shop_mixed.py` recounts both columns and checks they agree within 0.05.) Every task offers
every tool (`ShopMixedEnv` uses `tool_set="all"`), so the tools do not reveal the task. A task of one request is
one of the shop's own tasks (`order_status`, `cancel_order`, `return_item`, `address_update`, `exchange`: same
text, same checks), drawn with `SINGLE_WEIGHTS` so that the needs above come out as τ²-bench's. A task of
k >= 2 requests (family `mixed<k>`) puts k operations on one customer's orders: `status` (report an order's
status and total), `cancel` (allowed only when the order is pending; otherwise refused, saying its status),
`return` (the most expensive item of a delivered order: a choice among the order's records), `address` (a new
address in prose, to be split into exact fields; stated first when present). The user states the first request
and reveals each next one when the agent reports the previous one done (`MixedTask.later`, `ScriptedUser`).
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

from trace_cli.envs.shop.tasks.families import (
    build_address_update,
    build_cancel_order,
    build_exchange,
    build_order_status,
    build_return_item,
)
from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.worlds.generator import order_total
from trace_cli.envs.worlds.tasks import (
    REASON_PHRASES,
    STATE_NAMES,
    Action,
    Task,
    address_text,
    call,
    customer,
    new_address,
    priced_lines,
    say,
    task_tools,
)

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
SINGLE_WEIGHTS = {
    "order_status": 11,
    "cancel_order": 32,
    "return_item": 24,
    "address_update": 22,
    "exchange": 17,
}
# The operations of a several-request task, and how often each is drawn.
# tau2-bench's several-request tasks nearly all write (its 35 % of tasks with >= 2 requests and 35 % with >= 2
# writes are the same tasks): a read-only request is rare among them, and so is a refused cancel; more than half
# of them open with a write that needs no lookup (here: the address change, stated first).
OPERATIONS = {"status": 0.25, "cancel": 2.5, "return": 3, "address": 5}
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


def op_cancel(rng: random.Random, order: dict[str, Any], said: set[str]) -> MixedOp:
    """Cancel an order; a refused one is in a status no other request of the task reports (`said`), so that
    saying the status is evidence of having read this order."""
    refusable = [x for x in ("processed", "delivered") if x not in said]
    refused = rng.random() < P_CANCEL_REFUSED and bool(refusable)
    order["status"] = rng.choice(refusable) if refused else "pending"
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


@dataclass
class MixedTask(Task):
    """A task whose user states `request` first and reveals each of `later` once the previous is handled."""

    later: list[str] = field(default_factory=list)


def order_ops(
    rng: random.Random, kinds: list[str], b: Any, user: dict[str, Any], orders: list
) -> list[MixedOp]:
    """The operations of `kinds` on distinct orders of the customer (an address change, if any, comes first:
    τ²-bench's several-write tasks mostly open with a write that needs no lookup, see the module docstring)."""
    kinds = sorted(kinds, key=lambda k: k != "address")
    picked = rng.sample(orders, sum(k != "address" for k in kinds))
    targets = [None if k == "address" else picked.pop() for k in kinds]
    said = {o["status"] for k, o in zip(kinds, targets, strict=True) if k == "status"}
    ops: list[MixedOp] = []
    for kind, order in zip(kinds, targets, strict=True):
        if kind == "address":
            ops.append(op_address(rng, b, user))
        elif kind == "status":
            ops.append(op_status(order))
        elif kind == "cancel":
            ops.append(op_cancel(rng, order, said))
        else:
            ops.append(op_return(rng, b, order))
    return ops


def sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def handled(ops: list[MixedOp], reports: dict[int, str] | None = None, cap: str = "") -> list[Action]:
    """Each request carried out, then reported (the user reveals the next one after the report)."""
    reports = reports or {}
    out: list[Action] = []
    for i, op in enumerate(ops):
        out += [*op.deficit.get(cap, op.actions), say(sentence(reports.get(i, op.report)))]
    return out


def build_mixed(rng: random.Random, n_requests: int, n_orders: int) -> Task:
    """A task of `n_requests` >= 2 operations on one customer's orders (at most one address change), stated one
    at a time."""
    b, user, orders, ident, auth = customer(rng, n_orders)
    while True:
        kinds = rng.choices(list(OPERATIONS), weights=list(OPERATIONS.values()), k=n_requests)
        if kinds.count("address") <= 1:
            break
    ops = order_ops(rng, kinds, b, user, orders)
    reference = [auth, *handled(ops)]
    caps = sorted({c for op in ops for c in op.capabilities})
    deficits: dict[str, list[Action]] = {}
    for cap in caps:
        reports = {i: op.deficit_report[cap] for i, op in enumerate(ops) if cap in op.deficit_report}
        deficits[cap] = [auth, *handled(ops, reports, cap)]
    if sum(op.writes for op in ops) >= 2:
        caps.append("multi_step_completion")
        first = next(i for i, op in enumerate(ops) if op.writes)
        deficits["multi_step_completion"] = [auth, *handled(ops[: first + 1])]
    texts = [sentence(op.text) for op in ops]
    return MixedTask(
        f"mixed{n_requests}",
        caps,
        b.db,
        user["user_id"],
        ident,
        texts[0],
        task_tools(*MIXED_TOOLS),
        reference,
        required_facts=sorted({f for op in ops for f in op.facts}),
        deficit_demos=deficits,
        variant="+".join(op.kind for op in ops),
        later=texts[1:],
    )


def build_task(seed: int, n_orders: int) -> Task:
    """The `shop-mixed` task of a seed: the number of requests, then a shop family or several operations."""
    rng = random.Random(f"shop-mixed:{seed}")
    k = rng.choices(list(REQUESTS), weights=list(REQUESTS.values()))[0]
    if k == 1:
        fam = rng.choices(list(SINGLE_WEIGHTS), weights=list(SINGLE_WEIGHTS.values()))[0]
        return SINGLE[fam](rng, n_orders)
    return build_mixed(rng, k, n_orders)


# Every state-changing tool of τ²-bench's retail and airline domains (the shop's writes are among them).
EVERY_WRITE = frozenset(
    {
        *WRITES,
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "modify_pending_order_address",
        "modify_pending_order_payment",
        "update_reservation_flights",
        "cancel_reservation",
        "book_reservation",
        "update_reservation_baggages",
        "update_reservation_passengers",
        "send_certificate",
    }
)
EXACT_ARGUMENTS = frozenset({"item_ids", "new_item_ids", "address1", "flights", "passengers"})


def needs(actions: list[Action]) -> set[str]:
    """What a task's reference actions show it needs (the docstring's table): `refusal` (no write), `lookup` (a
    lookup before the first write), `exact_ids` (a write with item ids, flights, passengers or address fields),
    `several_writes` (>= 2 writes)."""
    calls = [a for a in actions if "name" in a]
    writes = [i for i, a in enumerate(calls) if a["name"] in EVERY_WRITE]
    found = set() if writes else {"refusal"}
    if writes and any(a["name"].startswith(("get_", "search_")) for a in calls[: writes[0]]):
        found.add("lookup")
    if any(EXACT_ARGUMENTS & set(calls[i].get("arguments") or {}) for i in writes):
        found.add("exact_ids")
    if len(writes) >= 2:
        found.add("several_writes")
    return found


def needs_figures(references: list[list[Action]], in_turn: list[bool] | None = None) -> dict[str, float]:
    """The docstring's figures of a list of tasks' reference actions; `in_turn`: whether each task's requests
    are revealed in turn (default: the tasks with >= 2 writes, as τ²-bench's users do)."""
    found = [needs(r) for r in references]
    n, single = len(found), [f for f in found if "several_writes" not in f]
    turn = in_turn if in_turn is not None else ["several_writes" in f for f in found]

    def share(xs: list[Any]) -> float:
        return round(sum(map(bool, xs)) / max(1, len(xs)), 3)

    return {
        "tasks": n,
        "two_or_more_needs": share([len(f) >= 2 for f in found]),
        "single_request_two_or_more": share([len(f) >= 2 for f in single]),
        "refusal": share(["refusal" in f for f in found]),
        "lookup_before_write": share(["lookup" in f for f in found]),
        "exact_ids": share(["exact_ids" in f for f in found]),
        "requests_in_turn": share(turn),
    }
