"""Memory preemption: a high-priority claim that finds every fitting card's memory held by
low-priority claims evicts just enough of them on one card — the fewest, youngest first,
never a high-priority claim, only claims whose class allows eviction. Victims get an
`evicting` event and their class's grace period; then they are released and placed again
elsewhere, or left pending with the reason, and the high-priority claim takes the room."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, and_, bindparam, func, insert, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, MAX_CORE_SHARE, ClaimStatus, Priority
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import claims, classes, gpus, nodes, preemptions, vgpus
from qshare_allocator.claims.transitions import emit, transition
from qshare_allocator.placement.demand import Demand


@dataclass(frozen=True)
class Victim:
    claim_id: uuid.UUID
    tenant: str
    node: str
    gpu: str
    mib: int
    grace_s: float


def may_evict(demand: Demand) -> bool:
    """Whether a miss of `demand` looks for low-priority claims to evict."""
    return demand.priority is Priority.HIGH and not demand.whole and demand.count == 1


async def plan(conn: AsyncConnection, demand: Demand, timeout_s: float) -> list[Victim]:
    """The fewest evictable LP claims on one card whose memory makes room; [] if none does."""
    if not may_evict(demand):
        return []
    params = {"node_timeout_s": timeout_s, "selector": demand.selector,
              "max_core": MAX_CORE_SHARE - demand.vcore}  # fmt: skip
    rows = list((await conn.execute(_candidates(), params)).all())
    best: list[Victim] = []
    for group in _by_card(rows).values():
        chosen = _enough(group, demand.vmemory_mib - group[0].free_mib)
        if chosen and (not best or len(chosen) < len(best)):
            best = chosen
    return best


async def under_way(conn: AsyncConnection) -> bool:
    """Whether any claim is being evicted now."""
    evicting = select(claims.c.id).where(
        claims.c.evict_at.is_not(None), claims.c.status.in_(HOLDING_STATUSES)
    )
    return (await conn.execute(evicting.limit(1))).first() is not None


async def lock_victims(conn: AsyncConnection, victims: list[Victim]) -> bool:
    """Lock the victims' claims (in id order); False when one changed since the plan was
    read: no longer holding, already evicting, resized or moved off the card."""
    ids = sorted(v.claim_id for v in victims)
    locked = select(claims.c.id).where(
        claims.c.id.in_(ids), claims.c.status.in_(HOLDING_STATUSES), claims.c.evict_at.is_(None)
    )
    if len((await conn.execute(locked.order_by(claims.c.id).with_for_update())).all()) < len(ids):
        return False
    held = select(vgpus.c.claim_id, vgpus.c.gpu_uuid, vgpus.c.vmemory_mib).where(
        vgpus.c.claim_id.in_(ids)
    )  # read after the locks: every change to these claims before them is committed
    now = {tuple(r) for r in (await conn.execute(held)).all()}
    return all((v.claim_id, v.gpu, v.mib) in now for v in victims)


async def start(
    conn: AsyncConnection, victims: list[Victim], for_claim: uuid.UUID, source: str
) -> str:
    """Mark the victims evicting (event, record); returns the waiting claim's reason."""
    for victim in victims:
        grace = timedelta(seconds=victim.grace_s)
        await conn.execute(
            update(claims).where(claims.c.id == victim.claim_id).values(evict_at=func.now() + grace)
        )
        reason = f"evicted for high-priority claim {for_claim}"
        await conn.execute(insert(preemptions).values(
            claim_id=victim.claim_id, tenant=victim.tenant, gpu_uuid=victim.gpu,
            node_name=victim.node, kind="eviction", reason=reason,
        ))  # fmt: skip
        await emit(conn, source, victim.claim_id, "evicting")
    grace_s = max(v.grace_s for v in victims)
    return (
        f"waiting for {len(victims)} low-priority claim(s) to be evicted from card "
        f"{victims[0].gpu} (grace {grace_s:g} s)"
    )


async def finish_due(conn: AsyncConnection, source: str) -> int:
    """Release the victims whose grace period is over and make them pending again."""
    due = (
        await conn.execute(
            select(claims)
            .where(claims.c.status.in_(HOLDING_STATUSES), claims.c.evict_at <= func.now())
            .with_for_update(skip_locked=True)
        )
    ).all()
    reason = "evicted for a high-priority claim; waiting to be placed again"
    for row in due:
        await transition(conn, source, row, ClaimStatus.PENDING, reason, release=True,
                         node_name=None, evict_at=None)  # fmt: skip
        await conn.execute(
            update(preemptions)
            .where(preemptions.c.claim_id == row.id, preemptions.c.kind == "eviction",
                   preemptions.c.ended_at.is_(None))
            .values(ended_at=func.now())
        )  # fmt: skip
    return len(due)


def _by_card(rows: list[Any]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for row in rows:
        found.setdefault(row.gpu_uuid, []).append(row)
    return found


def _enough(group: list[Any], missing_mib: int) -> list[Victim]:
    """Youngest first until the card has room; [] if even all of them are not enough."""
    chosen: list[Victim] = []
    for row in group:  # rows come youngest first
        if missing_mib <= 0:
            break
        chosen.append(Victim(row.claim_id, row.tenant, row.node_name, row.gpu_uuid,
                             row.vmemory_mib, row.eviction_grace_s))  # fmt: skip
        missing_mib -= row.vmemory_mib
    return chosen if missing_mib <= 0 else []


def _candidates() -> Any:
    """LP vGPUs that may be evicted, on cards where an HP slice would fit once they go."""
    card_ok = and_(
        gpus.c.healthy,
        gpus.c.core_high <= bindparam("max_core", type_=Integer),
        gpus.c.memory_mib - gpus.c.allocated_mib >= 0,
    )
    node_ok = and_(
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
    )
    return (
        select(
            vgpus.c.claim_id,
            vgpus.c.gpu_uuid,
            vgpus.c.node_name,
            vgpus.c.vmemory_mib,
            claims.c.tenant,
            classes.c.eviction_grace_s,
            (gpus.c.memory_mib - gpus.c.allocated_mib).label("free_mib"),
        )
        .join(claims, claims.c.id == vgpus.c.claim_id)
        .join(classes, classes.c.name == claims.c.class_name)
        .join(gpus, gpus.c.uuid == vgpus.c.gpu_uuid)
        .join(nodes, nodes.c.name == vgpus.c.node_name)
        .where(
            card_ok,
            node_ok,
            classes.c.evictable,
            claims.c.evict_at.is_(None),
            claims.c.priority == Priority.LOW.value,
            claims.c.status.in_(HOLDING_STATUSES),
        )
        .order_by(vgpus.c.gpu_uuid, claims.c.created_at.desc())
    )
