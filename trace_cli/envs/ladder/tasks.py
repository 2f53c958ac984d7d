"""Tasks of `shop-ladder` (issue 44, the mechanism test): conversations that need k = 1 or 2 planted skills jointly.

Two skills are planted in the mechanism test's base agent (its demonstrations withhold them 70 % of the time);
each is one kind of request, needs exactly one catalog capability, and fails, by construction, when done the
withheld way:

  skill    capability                  the request                           withheld (the deficit demonstration)
  refuse   precondition_verification   cancel an order that is processed     cancel without reading the order, then
                                       or delivered: read it, refuse, say    report it cancelled (the write is
                                       its status                            rejected; the status is never said)
  lookup   structured_data_reasoning   return the item the user names (by    read the order, return its first item
                                       product name) from a delivered        (never the named one): the id must be
                                       order: its id is only in the order's  taken from the lookup, not guessed
                                       details

A third skill, `address` (tool_calling_precision: copy a new address from prose field by field), was planted in the
first pair of bases and dropped: its capacity control reached 0.70 on `ladder-address` (the gate is 0.8; the
planted base 0.67), so the 2.6M-parameter agent cannot copy ids and addresses reliably even when never shown the
withheld way — a capacity limit, not a deficit (benchmarks/mechanism/README.md, "Restarts").

A task's family is a set of skills (`ladder-refuse`, `ladder-refuse+lookup`, ...; `k` its size): one request per
skill, on one customer's orders, stated one at a time (the user reveals the next request when the agent reports
the previous one done, as in shop-mixed; no skill here is "several writes", which a revealed-in-turn conversation
carries past). Success is all-or-nothing (the shop's verifier): the final database must equal the reference's and
every required fact must be said, so a task of family S fails whenever any skill of S is done the withheld way.

Families come in equal shares over consecutive seeds: k = 1 + seed % 2, and within k the skill sets take turns
(`family_for_seed`): any 2 consecutive seeds hold one task of each k, any 4 consecutive seeds (from a multiple
of 4) each one-skill family once and the two-skill family twice.

`mix="base"` is the planted base agent's demonstration distribution: even seeds are shop-mixed's own task of the
seed (`shop.tasks.mixed.build_task`, unchanged: its draws are shop-mixed's), odd seeds a ladder task. On the
shop-mixed half only the refusal is withheld (precondition_verification), never structured_data_reasoning there
(shop-mixed's "most expensive item" is a capacity limit of this model, not a planted skill: issue 44) nor
multi_step_completion nor tool_calling_precision.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from trace_cli.envs.shop.tasks.mixed import MIXED_TOOLS, MixedTask, sentence
from trace_cli.envs.shop.tools import CANCEL_REASONS
from trace_cli.envs.worlds.tasks import (
    REASON_PHRASES,
    Action,
    call,
    customer,
    lines_of_other_products,
    say,
    task_tools,
)

# skill -> the catalog capability it needs (the names the demonstrations withhold)
SKILLS: dict[str, str] = {
    "refuse": "precondition_verification",
    "lookup": "structured_data_reasoning",
}
PLANTED = tuple(SKILLS.values())
# every skill set, by size then in SKILLS order: k -> the families of k skills
BY_K: dict[int, list[tuple[str, ...]]] = {
    k: list(itertools.combinations(SKILLS, k)) for k in range(1, len(SKILLS) + 1)
}
MIXES = ("target", "base")
# the capabilities a base demonstration withholds on shop-mixed's own tasks (see the module docstring)
PLANTED_ON_MIXED = ("precondition_verification",)


def family_name(skills: tuple[str, ...]) -> str:
    return "ladder-" + "+".join(skills)


def skills_for_seed(seed: int) -> tuple[str, ...]:
    """The skill set of a ladder seed: k = 1 + seed % (number of skills), then the sets of size k in turn."""
    k = 1 + seed % len(SKILLS)
    sets = BY_K[k]
    return sets[(seed // len(SKILLS)) % len(sets)]


FAMILIES = [family_name(s) for k in sorted(BY_K) for s in BY_K[k]]


@dataclass
class LadderOp:
    """One request: its text, the right actions and report, and the withheld way (actions and report)."""

    skill: str
    text: str
    actions: list[Action]
    report: str
    facts: list[str]
    withheld: list[Action]
    withheld_report: str


def op_refuse(rng: random.Random, order: dict[str, Any]) -> LadderOp:
    order["status"] = rng.choice(["processed", "delivered"])
    oid, status = order["order_id"], order["status"]
    reason = rng.choice(CANCEL_REASONS)
    return LadderOp(
        "refuse",
        f"cancel order {oid} ({rng.choice(REASON_PHRASES[reason])})",
        [call("get_order_details", order_id=oid)],
        f"order {oid} is {status}, so it cannot be cancelled (only pending orders can)",
        [status],
        [call("cancel_pending_order", order_id=oid, reason=reason)],
        f"order {oid} is cancelled",
    )


def op_lookup(rng: random.Random, b: Any, order: dict[str, Any]) -> LadderOp:
    """Return the item the user names from a delivered order of 2-3 distinct products; the named one is never
    listed first (the withheld way returns the first)."""
    order["status"] = "delivered"
    lines = lines_of_other_products(b, rng.choice([2, 3]), set())
    line = lines[rng.randrange(1, len(lines))]
    order["items"] = lines
    oid, pm = order["order_id"], order["payment_method_id"]

    def ret(item: dict[str, Any]) -> list[Action]:
        return [
            call("get_order_details", order_id=oid),
            call(
                "return_delivered_order_items", order_id=oid, item_ids=[item["item_id"]], payment_method_id=pm
            ),
        ]

    return LadderOp(
        "lookup",
        f"return the {line['name']} from order {oid} to the original payment method",
        ret(line),
        f"the return of the {line['name']} from order {oid} is requested ({line['price']:.2f} dollars back)",
        [f"{line['price']:.2f}"],
        ret(lines[0]),
        f"the return from order {oid} is requested",
    )


@dataclass
class LadderTask(MixedTask):
    """A ladder task: its skills (in the order requested) and their withheld demonstrations, built per set."""

    skills: list[str] = field(default_factory=list)
    ops: list[LadderOp] = field(default_factory=list)
    auth: Action | None = None

    def withholding(self, capabilities: set[str]) -> list[Action]:
        """The demonstration with every skill whose capability is named done the withheld way."""
        out: list[Action] = [self.auth] if self.auth else []
        for op in self.ops:
            off = SKILLS[op.skill] in capabilities
            out += [
                *(op.withheld if off else op.actions),
                say(sentence(op.withheld_report if off else op.report)),
            ]
        return out


def build_ladder(seed: int, n_orders: int) -> LadderTask:
    """The ladder task of a seed (`skills_for_seed` decides its family)."""
    skills = skills_for_seed(seed)
    rng = random.Random(f"shop-ladder:{seed}")
    b, user, orders, ident, auth = customer(rng, n_orders)
    picked = rng.sample(orders, len(skills))
    ops: list[LadderOp] = []
    for s in skills:
        if s == "refuse":
            ops.append(op_refuse(rng, picked.pop()))
        else:
            ops.append(op_lookup(rng, b, picked.pop()))
    rng.shuffle(ops)
    texts = [sentence(op.text) for op in ops]
    task = LadderTask(
        family_name(skills),
        [SKILLS[s] for s in skills],
        b.db,
        user["user_id"],
        ident,
        texts[0],
        task_tools(*MIXED_TOOLS),
        [],
        required_facts=sorted({f for op in ops for f in op.facts}),
        variant="+".join(op.skill for op in ops),  # the order they are asked in
        later=texts[1:],
        skills=list(skills),
        ops=ops,
        auth=auth,
    )
    task.reference = task.withholding(set())
    # one demonstration per capability (ShopEnv's contract), and `withholding` for several at once
    task.deficit_demos = {SKILLS[s]: task.withholding({SKILLS[s]}) for s in skills}
    return task


def build_task(seed: int, n_orders: int, mix: str = "target") -> Any:
    """The task of a seed: a ladder task, or (mix "base", even seeds) shop-mixed's own task of the seed."""
    if mix == "base" and seed % 2 == 0:
        from trace_cli.envs.shop.tasks.mixed import build_task as mixed_task

        return mixed_task(seed, n_orders)
    return build_ladder(seed, n_orders)
