"""Which low-priority claims a high-priority claim evicts: on one node, the `count` cards that
need the fewest evictions to fit it. A card fits once it has the claim's memory free and a
free vGPU slot (a whole card: once every vGPU on it is gone). Only low-priority claims of
evictable classes go, the fewest that make room and the youngest among equally few; a card
with other vGPUs than those never empties."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Integer, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, MAX_CORE_SHARE, Priority
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import claims, classes, gpus, nodes, vgpus
from qshare_allocator.placement.demand import Demand


@dataclass(frozen=True)
class Victim:
    claim_id: uuid.UUID
    tenant: str
    node: str
    gpu: str
    mib: int
    grace_s: float


@dataclass
class CardState:
    """A usable card and the evictable vGPUs on it, youngest first."""

    uuid: str
    node: str
    free_mib: int
    vgpu_count: int
    max_vgpus: int
    evictable: list[Victim] = field(default_factory=list)


def may_evict(demand: Demand) -> bool:
    """Whether a miss of `demand` looks for low-priority claims to evict."""
    return demand.priority is Priority.HIGH


async def plan(conn: AsyncConnection, demand: Demand, timeout_s: float) -> list[Victim]:
    """The fewest evictable LP claims on one node that make room for `demand`; [] if none do
    (or if nothing needs to go)."""
    if not may_evict(demand):
        return []
    params = {"node_timeout_s": timeout_s, "selector": demand.selector,
              "max_core": MAX_CORE_SHARE - demand.card_vcore,
              "need_card_mib": demand.vmemory_mib}  # fmt: skip
    cards = await _cards(conn, params, demand.whole)
    best: list[Victim] = []
    for node_cards in _by_node(cards).values():
        chosen = node_victims(node_cards, demand)
        if chosen and (not best or len(chosen) < len(best)):
            best = chosen
    return best


def node_victims(cards: Sequence[CardState], demand: Demand) -> list[Victim]:
    """The fewest victims that make `demand.count` of `cards` fit, each claim once; [] when
    the node cannot host it however many go."""
    options = [v for v in (card_victims(c, demand) for c in cards) if v is not None]
    if len(options) < demand.count:
        return []
    unique: dict[uuid.UUID, Victim] = {}
    for victims in sorted(options, key=len)[: demand.count]:
        for victim in victims:
            unique.setdefault(victim.claim_id, victim)
    return list(unique.values())


def card_victims(card: CardState, demand: Demand) -> list[Victim] | None:
    """The fewest victims that make `demand` fit on `card`, the youngest among equally few;
    None when even all of them are not enough ([] when it fits already)."""
    if demand.whole:
        return card.evictable if len(card.evictable) == card.vgpu_count else None
    missing_mib = demand.vmemory_mib - card.free_mib
    fewest = _fewest(card.evictable, missing_mib, card.vgpu_count - card.max_vgpus + 1)
    if fewest is None:
        return None
    chosen: list[Victim] = []
    for i, victim in enumerate(card.evictable):  # youngest first
        left = fewest - len(chosen)
        if left == 0:
            break
        if _frees(card.evictable[i + 1 :], left - 1) >= missing_mib - victim.mib:
            chosen.append(victim)  # the rest can still make up what this one leaves
            missing_mib -= victim.mib
    return chosen


def _fewest(victims: list[Victim], missing_mib: int, missing_slots: int) -> int | None:
    """How few of `victims` free `missing_mib` and `missing_slots`; None: not all do."""
    for count in range(max(missing_slots, 0), len(victims) + 1):
        if _frees(victims, count) >= missing_mib:
            return count
    return None


def _frees(victims: Sequence[Victim], count: int) -> int:
    """The most memory `count` of `victims` free."""
    return sum(sorted((v.mib for v in victims), reverse=True)[:count])


def _by_node(cards: list[CardState]) -> dict[str, list[CardState]]:
    found: dict[str, list[CardState]] = {}
    for card in cards:
        found.setdefault(card.node, []).append(card)
    return found


async def _cards(conn: AsyncConnection, params: dict[str, Any], whole: bool) -> list[CardState]:
    """Every usable card on the Ready, schedulable, matching nodes that hold an evictable
    vGPU, that would fit once its evictable vGPUs left, with those vGPUs."""
    rows = (await conn.execute(_cards_query(whole), params)).all()
    if not rows:
        return []
    cards = {r.uuid: CardState(r.uuid, r.node_name, r.free_mib, r.vgpu_count, r.max_vgpus)
             for r in rows}  # fmt: skip
    for r in (await conn.execute(_evictable_query(), {"cards": list(cards)})).all():
        victim = Victim(r.claim_id, r.tenant, r.node_name, r.gpu_uuid, r.vmemory_mib,
                        r.eviction_grace_s)  # fmt: skip
        cards[r.gpu_uuid].evictable.append(victim)
    return list(cards.values())


def _evictable() -> ColumnElement[bool]:
    return and_(
        classes.c.evictable,
        claims.c.evict_at.is_(None),
        claims.c.priority == Priority.LOW.value,
        claims.c.status.in_(HOLDING_STATUSES),
    )


def _evictable_join() -> Any:
    return vgpus.join(claims, claims.c.id == vgpus.c.claim_id).join(
        classes, classes.c.name == claims.c.class_name
    )


@functools.cache
def _cards_query(whole: bool) -> Any:
    """The cards, each only if it fits once all its evictable vGPUs leave: a card that
    cannot is never read (a claim eviction cannot help costs the sweep little)."""
    with_victims = select(vgpus.c.node_name).select_from(_evictable_join()).where(_evictable())
    gone = (
        select(vgpus.c.gpu_uuid, func.sum(vgpus.c.vmemory_mib).label("mib"),
               func.count().label("vgpus"))
        .select_from(_evictable_join()).where(_evictable()).group_by(vgpus.c.gpu_uuid)
        .subquery("gone")
    )  # fmt: skip
    gone_mib, gone_count = func.coalesce(gone.c.mib, 0), func.coalesce(gone.c.vgpus, 0)
    free_mib = gpus.c.memory_mib - gpus.c.allocated_mib
    could_fit = (
        gone_count == gpus.c.vgpu_count
        if whole
        else and_(
            free_mib + gone_mib >= bindparam("need_card_mib", type_=Integer),
            gpus.c.vgpu_count - gone_count < gpus.c.max_vgpus,
        )
    )
    return select(
        gpus.c.uuid, gpus.c.node_name, gpus.c.vgpu_count, gpus.c.max_vgpus,
        free_mib.label("free_mib"),
    ).join(nodes, nodes.c.name == gpus.c.node_name).outerjoin(
        gone, gone.c.gpu_uuid == gpus.c.uuid
    ).where(
        gpus.c.healthy,
        gpus.c.retired.is_(False),
        gpus.c.core_high <= bindparam("max_core", type_=Integer),
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
        nodes.c.name.in_(with_victims),
        could_fit,
    ).order_by(gpus.c.node_name, gpus.c.idx)  # fmt: skip


@functools.cache
def _evictable_query() -> Any:
    return (
        select(
            vgpus.c.claim_id, vgpus.c.gpu_uuid, vgpus.c.node_name, vgpus.c.vmemory_mib,
            claims.c.tenant, classes.c.eviction_grace_s,
        )
        .select_from(_evictable_join())
        .where(_evictable(), vgpus.c.gpu_uuid.in_(bindparam("cards", expanding=True)))
        .order_by(vgpus.c.gpu_uuid, claims.c.created_at.desc())
    )  # fmt: skip
