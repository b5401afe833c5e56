"""Finds a node that can host a demand and locks it: the serialisation point of placement.

Every change to a card's allocation happens while its node's row is locked (`FOR UPDATE`),
so replicas may place concurrently on different nodes and never on the same card at once.
The fast path takes the best node nobody holds (`SKIP LOCKED`); if that fails, the exact
path lists every node with enough fitting cards and waits for each lock in turn, so a claim
goes Pending only when nothing fits once concurrent placements have committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qshare.contracts.domain import PlacementPolicy, Priority
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import gpus, nodes
from sqlalchemy import ColumnElement, Select, and_, func, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

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
    tried: list[str] = []
    for _ in range(FAST_ATTEMPTS):
        node = await _scalar(conn, _node_query(demand, timeout_s, tried).limit(1), skip=True)
        if node is None:
            break
        if choice := await _cards_on(conn, node, demand):
            return choice
        tried.append(node)
    for node in (await conn.execute(_exact_query(demand, timeout_s, tried))).scalars().all():
        locked = await _scalar(conn, _node_query(demand, timeout_s, []).where(nodes.c.name == node))
        if locked is not None and (choice := await _cards_on(conn, node, demand)):
            return choice
    return None


async def _scalar(conn: AsyncConnection, query: Select[Any], skip: bool = False) -> str | None:
    name: str | None = (
        await conn.execute(query.with_for_update(skip_locked=skip))
    ).scalar_one_or_none()
    return name


async def _cards_on(conn: AsyncConnection, node: str, demand: Demand) -> Choice | None:
    free = gpus.c.memory_mib - gpus.c.allocated_mib
    order = free.desc() if demand.card_policy is PlacementPolicy.SPREAD else free.asc()
    query = (
        select(gpus.c.uuid, gpus.c.idx, gpus.c.memory_mib)
        .where(gpus.c.node_name == node, _card_fits(demand))
        .order_by(order, gpus.c.idx)
        .limit(demand.count)
    )
    rows = (await conn.execute(query)).all()
    if len(rows) < demand.count:
        return None
    return Choice(node, [Card(r.uuid, r.idx, r.memory_mib) for r in rows])


def _node_query(demand: Demand, timeout_s: float, tried: list[str]) -> Select[Any]:
    query = select(nodes.c.name).where(_node_fits(demand, timeout_s))
    return _best_first(query, demand, tried)


def _exact_query(demand: Demand, timeout_s: float, tried: list[str]) -> Select[Any]:
    """Every node with at least `count` fitting cards, best first (no locks)."""
    query = (
        select(nodes.c.name)
        .join(gpus, gpus.c.node_name == nodes.c.name)
        .where(_node_fits(demand, timeout_s), _card_fits(demand))
        .group_by(nodes.c.name, nodes.c.free_mib)
        .having(func.count() >= demand.count)
    )
    return _best_first(query, demand, tried)


def _best_first(query: Select[Any], demand: Demand, tried: list[str]) -> Select[Any]:
    """Order nodes by the node policy, leaving out those already tried."""
    if tried:
        query = query.where(nodes.c.name.not_in(tried))
    if demand.node_policy is PlacementPolicy.SPREAD:
        return query.order_by(nodes.c.free_mib.desc(), nodes.c.name.desc())
    return query.order_by(nodes.c.free_mib.asc(), nodes.c.name.asc())


def _node_fits(demand: Demand, timeout_s: float) -> ColumnElement[bool]:
    return and_(
        nodes.c.schedulable,
        node_is_ready(timeout_s),
        nodes.c.free_mib >= demand.node_free_needed,
        nodes.c.labels.contains(literal(demand.selector, JSONB)),
    )


def _card_fits(demand: Demand) -> ColumnElement[bool]:
    core = gpus.c.core_high if demand.priority is Priority.HIGH else gpus.c.core_low
    if demand.whole:
        return and_(gpus.c.healthy, gpus.c.vgpu_count == 0, gpus.c.allocated_mib == 0)
    return and_(
        gpus.c.healthy,
        gpus.c.memory_mib - gpus.c.allocated_mib >= demand.vmemory_mib,
        core + demand.vcore <= 100,
        gpus.c.vgpu_count < gpus.c.max_vgpus,
    )
