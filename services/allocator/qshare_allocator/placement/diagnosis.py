"""Why a claim does not fit: the pending reason says what is really missing (no node, no
Ready node, no card that large, or no free capacity), and a claim that no registered card
could ever hold is refused at once rather than left pending."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.errors import InvalidInput
from qshare.contracts.quantities import format_mib
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import gpus, nodes
from qshare_allocator.placement.demand import Demand, quoted_selector


async def why_not(conn: AsyncConnection, demand: Demand, timeout_s: float) -> str:
    """The pending reason; raises InvalidInput when no registered card could ever fit."""
    facts = (await conn.execute(_facts(), _params(demand, timeout_s))).one()
    if facts.cards and not demand.whole and demand.vmemory_mib > facts.largest_mib:
        raise InvalidInput.on(
            "vmemory",
            f"{format_mib(demand.vmemory_mib)} is more than any card in the cluster has "
            f"(the largest has {format_mib(facts.largest_mib)})",
        )
    if facts.cards and demand.count > facts.most_cards:
        raise InvalidInput.on(
            "count", f"no node has {demand.count} cards (the most on one node: {facts.most_cards})"
        )
    return _reason(facts, demand)


def _reason(facts: Any, demand: Demand) -> str:
    selector = f" matching {quoted_selector(demand.selector)}" if demand.selector else ""
    if not facts.nodes:
        return "no node is registered yet"
    if not facts.ready:
        return f"no Ready, schedulable node{selector} ({facts.nodes} registered)"
    if not facts.big_enough:
        size = "empty" if demand.whole else f"of at least {format_mib(demand.vmemory_mib)}"
        return f"no Ready node{selector} has {demand.count} healthy card(s) {size}"
    return demand.describe()


def _params(demand: Demand, timeout_s: float) -> dict[str, Any]:
    return {
        "node_timeout_s": timeout_s,
        "selector": demand.selector,
        "need": 1 if demand.whole else demand.vmemory_mib,
        "count": demand.count,
    }


def _facts() -> Any:
    usable = and_(
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
    )
    big_cards = (
        select(func.count())
        .where(
            gpus.c.node_name == nodes.c.name, gpus.c.healthy, gpus.c.memory_mib >= bindparam("need")
        )
        .scalar_subquery()
    )
    per_node = select(func.count()).where(gpus.c.node_name == nodes.c.name).scalar_subquery()
    return select(
        func.count().label("nodes"),
        func.count().filter(usable).label("ready"),
        func.count().filter(and_(usable, big_cards >= bindparam("count"))).label("big_enough"),
        func.coalesce(func.max(per_node), 0).label("most_cards"),
        select(func.count()).select_from(gpus).scalar_subquery().label("cards"),
        select(func.coalesce(func.max(gpus.c.memory_mib), 0))
        .scalar_subquery()
        .label("largest_mib"),
    ).select_from(nodes)
