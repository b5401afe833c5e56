"""Finds a node that can host a demand and locks it: the serialisation point of placement.

Every change to a card's allocation happens while its node's row is locked (`FOR UPDATE`),
so replicas may place concurrently on different nodes and never on the same card at once.
The fast path takes the best node nobody holds (`SKIP LOCKED`); if that fails, the exact
path lists every node with enough fitting cards and waits for each lock in turn, so a claim
goes Pending only when nothing fits once concurrent placements have committed.

A node is locked and its fitting cards read in one statement: the cards are read `FOR
UPDATE` too, which in READ COMMITTED returns (and re-checks) their latest committed
version, so what a concurrent placement committed a moment before is never missed.

Queries are built once per shape and take the demand as parameters; they run straight on
asyncpg (`db.fetch`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Select,
    Text,
    all_,
    and_,
    bindparam,
    func,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import MAX_CORE_SHARE, PlacementPolicy, Priority
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import gpus, nodes
from qshare_allocator.db import fetch
from qshare_allocator.placement.demand import Demand

FAST_ATTEMPTS = 3


@dataclass(frozen=True)
class Card:
    uuid: str
    idx: int
    memory_mib: int


@dataclass(frozen=True)
class Choice:
    node: str
    cards: list[Card]
    agent: bool = True
    """Whether an agent registered the node (read under its lock): one without is only
    placed on, never sent a desired state."""


async def find_and_lock(conn: AsyncConnection, demand: Demand, timeout_s: float) -> Choice | None:
    """The node and cards for `demand`, the node locked until commit; None when nothing fits."""
    params = _params(demand, timeout_s)
    shape = (demand.priority, demand.whole, demand.card_policy)
    tried: list[str] = []
    for attempt in range(FAST_ATTEMPTS):
        query = _best_free_node(demand.node_policy, *shape, with_room=attempt > 0)
        rows = await fetch(conn, query, params | {"tried": tried})
        if not rows:
            break
        if choice := _choice(rows, demand):
            return choice
        tried.append(rows[0]["node_name"])
    exact = _nodes_with_room(demand.node_policy, demand.priority, demand.whole)
    for (node,) in await fetch(conn, exact, params | {"tried": tried}):
        savepoint = await conn.begin_nested()  # a miss gives its lock back at once
        rows = await fetch(conn, _named_node(*shape), params | {"node": node})
        if choice := _choice(rows, demand):
            await savepoint.commit()
            return choice
        await savepoint.rollback()
    return None


def _params(demand: Demand, timeout_s: float) -> dict[str, Any]:
    return {
        "node_timeout_s": timeout_s,
        "need_node_mib": demand.node_free_needed,
        "need_card_mib": demand.vmemory_mib,
        "max_core": MAX_CORE_SHARE - demand.vcore,
        "selector": demand.selector,
        "count": demand.count,
    }


def _choice(rows: Sequence[Any], demand: Demand) -> Choice | None:
    """The node's fitting cards, if there are enough of them; rows are `_cards_of` rows."""
    cards = [Card(r["uuid"], r["idx"], r["memory_mib"]) for r in rows if r["uuid"] is not None]
    if not rows or len(cards) < demand.count:
        return None
    return Choice(rows[0]["node_name"], cards, rows[0]["agent"])


@functools.cache
def _best_free_node(
    policy: PlacementPolicy,
    priority: Priority,
    whole: bool,
    card_policy: PlacementPolicy,
    with_room: bool,
) -> Select[Any]:
    """Lock the best node nobody holds, and read its fitting cards. After a miss, only a node
    whose cards have room (as far as the snapshot shows) is locked: a node that cannot host
    the claim is rarely held, so transactions rarely wait on each other's misses."""
    query = select(nodes.c.name, _agent()).where(
        _node_fits(), nodes.c.name != all_(bindparam("tried", type_=ARRAY(Text)))
    )
    if with_room:
        query = query.where(_room_on_node(priority, whole))
    node = _ordered(query, policy, priority).limit(1).with_for_update(skip_locked=True).cte("node")
    return _cards_of(node, priority, whole, card_policy)


@functools.cache
def _named_node(priority: Priority, whole: bool, card_policy: PlacementPolicy) -> Select[Any]:
    """Wait for one named node's lock (nothing if it no longer fits), read its fitting cards."""
    query = select(nodes.c.name, _agent()).where(nodes.c.name == bindparam("node"), _node_fits())
    return _cards_of(query.with_for_update().cte("node"), priority, whole, card_policy)


def _cards_of(node: CTE, priority: Priority, whole: bool, policy: PlacementPolicy) -> Select[Any]:
    """The locked node's name with each fitting card, best first, cards locked too; a node
    without one fitting card still yields one row (uuid NULL), so a miss can be retried."""
    fitting = (
        select(gpus.c.uuid, gpus.c.idx, gpus.c.memory_mib)
        .where(gpus.c.node_name == node.c.name, _card_fits(priority, whole))
        .order_by(*_card_order(priority, policy), gpus.c.idx)
        .limit(bindparam("count"))
        .with_for_update()
        .lateral("card")
    )
    columns = (node.c.name.label("node_name"), node.c.agent)
    return select(*columns, fitting).select_from(node).outerjoin(fitting, true())


def _agent() -> ColumnElement[bool]:
    return nodes.c.segment.is_not(None).label("agent")


@functools.cache
def _nodes_with_room(policy: PlacementPolicy, priority: Priority, whole: bool) -> Select[Any]:
    """Every node with at least `count` fitting cards, best first (no locks)."""
    query = (
        select(nodes.c.name)
        .join(gpus, gpus.c.node_name == nodes.c.name)
        .where(
            _node_fits(),
            _card_fits(priority, whole),
            nodes.c.name != all_(bindparam("tried", type_=ARRAY(Text))),
        )
        .group_by(nodes.c.name, nodes.c.free_mib, nodes.c.core_high, nodes.c.core_low)
        .having(func.count() >= bindparam("count"))
    )
    return _ordered(query, policy, priority)


def _room_on_node(priority: Priority, whole: bool) -> ColumnElement[bool]:
    fitting = (
        select(func.count())
        .where(gpus.c.node_name == nodes.c.name, _card_fits(priority, whole))
        .scalar_subquery()
    )
    return fitting >= bindparam("count")


def _ordered(query: Select[Any], policy: PlacementPolicy, priority: Priority) -> Select[Any]:
    """Spread or binpack against the claim's own kind first: an HP claim spreads away from
    other HP work, not from LP work, and prefers a node with the other kind's work on it (so
    high and low priority co-locate); free memory decides among equals. The per-node core
    sums are kept on the node row with its free memory."""
    same, other = (
        (nodes.c.core_high, nodes.c.core_low)
        if priority is Priority.HIGH
        else (nodes.c.core_low, nodes.c.core_high)
    )
    spread = policy is PlacementPolicy.SPREAD
    return query.order_by(
        same.asc() if spread else same.desc(),
        other.desc(),
        nodes.c.free_mib.desc() if spread else nodes.c.free_mib.asc(),
        nodes.c.name.desc() if spread else nodes.c.name.asc(),
    )


def _kinds(priority: Priority) -> tuple[Any, Any]:
    """(the claim's own core column of a card, the other priority's)."""
    if priority is Priority.HIGH:
        return gpus.c.core_high, gpus.c.core_low
    return gpus.c.core_low, gpus.c.core_high


def _card_order(priority: Priority, policy: PlacementPolicy) -> tuple[Any, ...]:
    """Cards as nodes: the claim's own kind spread or packed, the other kind's work sought."""
    same, other = _kinds(priority)
    free = gpus.c.memory_mib - gpus.c.allocated_mib
    if policy is PlacementPolicy.SPREAD:
        return same.asc(), other.desc(), free.desc()
    return same.desc(), other.desc(), free.asc()


def _node_fits() -> ColumnElement[bool]:
    return and_(
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.free_mib >= bindparam("need_node_mib"),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
    )


def _card_fits(priority: Priority, whole: bool) -> ColumnElement[bool]:
    usable = and_(gpus.c.healthy, gpus.c.retired.is_(False))
    if whole:
        return and_(usable, gpus.c.vgpu_count == 0, gpus.c.allocated_mib == 0)
    core = gpus.c.core_high if priority is Priority.HIGH else gpus.c.core_low
    return and_(
        usable,
        gpus.c.memory_mib - gpus.c.allocated_mib >= bindparam("need_card_mib"),
        core <= bindparam("max_core"),
        gpus.c.vgpu_count < gpus.c.max_vgpus,
    )
