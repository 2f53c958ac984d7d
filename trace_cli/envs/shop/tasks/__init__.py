"""Task families of the shop world: each builds a database, a request, a reference solution and deficit demos.

A family is a function `build_<family>(rng, n_orders) -> Task` (in `families`; the pieces they share, which
the synthetic templates use too, are in `common`). Everything is drawn from the `random.Random` it is given, so a
(seed, family) pair always yields the same task. The reference solution is written from ground truth; the
environment replays it once at reset to obtain the target database state, so reward and reference can never
drift apart.

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

from trace_cli.envs.shop.tasks.families import (
    build_address_update,
    build_cancel_order,
    build_exchange,
    build_multi_op,
    build_order_status,
    build_return_item,
)
from trace_cli.envs.worlds.tasks import Action, Task, call, say

CAPABILITIES = (
    "precondition_verification",
    "structured_data_reasoning",
    "multi_step_completion",
    "tool_calling_precision",
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

__all__ = ["CAPABILITIES", "FAMILIES", "FAMILY_CAPABILITIES", "Action", "Task", "call", "say"]
