"""The world-building helpers an environment module imports (`from trace_cli.envs.synthetic.common import
identify, world`, as the LLM author's prompt shows): the shop's own task pieces, re-exported under the name
authored modules already use. The templates import them from `trace_cli.envs.worlds.tasks` directly."""

from __future__ import annotations

from trace_cli.envs.worlds.tasks import (
    ORDER_STATUSES,
    REASON_PHRASES,
    address_text,
    describe,
    gift_card,
    identify,
    identity_keys,
    join_ops,
    lines_of_other_products,
    new_address,
    world,
)

__all__ = [
    "ORDER_STATUSES",
    "REASON_PHRASES",
    "address_text",
    "describe",
    "gift_card",
    "identify",
    "identity_keys",
    "join_ops",
    "lines_of_other_products",
    "new_address",
    "world",
]
