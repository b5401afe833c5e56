"""Finds a node that can host a demand and locks it: the serialisation point of placement.

Every change to a card's allocation happens while its node's row is locked (`FOR UPDATE`),
so replicas may place concurrently on different nodes and never on the same card at once.
The fast path takes the best node nobody holds (`SKIP LOCKED`); if that fails, the exact
path lists every node with enough fitting cards and waits for each lock in turn, so a claim
goes Pending only when nothing fits once concurrent placements have committed.

Queries are built once per shape and take the demand as parameters.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import MAX_CORE_SHARE, PlacementPolicy, Priority
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import gpus, nodes
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


async def find_and_lock(conn: AsyncConnection, demand: Demand, timeout_s: float) -> Choice | None:
    """The node and cards for `demand`, the node locked until commit; None when nothing fits."""
    params = _params(demand, timeout_s)
    tried: list[str] = []
    for _ in range(FAST_ATTEMPTS):
        query = _best_free_node(demand.node_policy)
        node = (await conn.execute(query, params | {"tried": tried})).scalar_one_or_none()
        if node is None:
            break
        if choice := await _cards_on(conn, node, demand, params):
            return choice
        tried.append(node)
    exact = _nodes_with_room(demand.node_policy, demand.priority, demand.whole)
    for node in (await conn.execute(exact, params | {"tried": tried})).scalars().all():
        locked = await conn.execute(_lock_node(), params | {"node": node})
        if locked.scalar_one_or_none() and (choice := await _cards_on(conn, node, demand, params)):
            return choice
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


async def _cards_on(
    conn: AsyncConnection, node: str, demand: Demand, params: dict[str, Any]
) -> Choice | None:
    query = _fitting_cards(demand.card_policy, demand.priority, demand.whole)
    rows = (await conn.execute(query, params | {"node": node})).all()
    if len(rows) < demand.count:
        return None
    return Choice(node, [Card(r.uuid, r.idx, r.memory_mib) for r in rows])


@functools.cache
def _best_free_node(policy: PlacementPolicy) -> Select[Any]:
    query = select(nodes.c.name).where(_node_fits(), nodes.c.name.not_in(bindparam("tried")))
    return _ordered(query, policy).limit(1).with_for_update(skip_locked=True)


@functools.cache
def _lock_node() -> Select[Any]:
    """Wait for one named node's lock; None if it no longer fits once locked."""
    query = select(nodes.c.name).where(nodes.c.name == bindparam("node"), _node_fits())
    return query.with_for_update()


@functools.cache
def _nodes_with_room(policy: PlacementPolicy, priority: Priority, whole: bool) -> Select[Any]:
    """Every node with at least `count` fitting cards, best first (no locks)."""
    query = (
        select(nodes.c.name)
        .join(gpus, gpus.c.node_name == nodes.c.name)
        .where(_node_fits(), _card_fits(priority, whole), nodes.c.name.not_in(bindparam("tried")))
        .group_by(nodes.c.name, nodes.c.free_mib)
        .having(func.count() >= bindparam("count"))
    )
    return _ordered(query, policy)


@functools.cache
def _fitting_cards(policy: PlacementPolicy, priority: Priority, whole: bool) -> Select[Any]:
    free = gpus.c.memory_mib - gpus.c.allocated_mib
    order = free.desc() if policy is PlacementPolicy.SPREAD else free.asc()
    return (
        select(gpus.c.uuid, gpus.c.idx, gpus.c.memory_mib)
        .where(gpus.c.node_name == bindparam("node"), _card_fits(priority, whole))
        .order_by(order, gpus.c.idx)
        .limit(bindparam("count"))
    )


def _ordered(query: Select[Any], policy: PlacementPolicy) -> Select[Any]:
    if policy is PlacementPolicy.SPREAD:
        return query.order_by(nodes.c.free_mib.desc(), nodes.c.name.desc())
    return query.order_by(nodes.c.free_mib.asc(), nodes.c.name.asc())


def _node_fits() -> ColumnElement[bool]:
    return and_(
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.free_mib >= bindparam("need_node_mib"),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
    )


def _card_fits(priority: Priority, whole: bool) -> ColumnElement[bool]:
    if whole:
        return and_(gpus.c.healthy, gpus.c.vgpu_count == 0, gpus.c.allocated_mib == 0)
    core = gpus.c.core_high if priority is Priority.HIGH else gpus.c.core_low
    return and_(
        gpus.c.healthy,
        gpus.c.memory_mib - gpus.c.allocated_mib >= bindparam("need_card_mib"),
        core <= bindparam("max_core"),
        gpus.c.vgpu_count < gpus.c.max_vgpus,
    )
