"""Memory preemption: a high-priority claim that finds no room held by low-priority claims
evicts the fewest of them that make room (`eviction_plan`). Victims get an `evicting` event
and their class's grace period; then they are released and placed again elsewhere, or left
pending with the reason, and the high-priority claim takes the room."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus, Priority
from qshare.contracts.schema import claims, preemptions, vgpus
from qshare_allocator.claims.transitions import emit, transition
from qshare_allocator.placement.eviction_plan import Victim

EVICTED_FOR = "evicted for high-priority claim "
"""An eviction record's reason, followed by the id of the claim it makes room for (which
the record's `for_claim` holds)."""


CALLED_OFF = "eviction called off: high-priority claim "
"""The reason a victim kept its vGPUs carries, followed by the id of the claim it was evicted
for (deleted, or placed elsewhere, before the grace ended)."""


async def under_way_for(conn: AsyncConnection, claim_id: uuid.UUID) -> bool:
    """Whether claims are being evicted for `claim_id` now (a record whose victim left
    some other way, deleted or failed during its grace, does not count)."""
    evicting = (
        select(preemptions.c.id)
        .join(claims, claims.c.id == preemptions.c.claim_id)
        .where(
            preemptions.c.for_claim == claim_id, preemptions.c.ended_at.is_(None),
            preemptions.c.kind == "eviction", claims.c.evict_at.is_not(None),
            claims.c.status.in_(HOLDING_STATUSES),
        )
    )  # fmt: skip
    return (await conn.execute(evicting.limit(1))).first() is not None


async def lock_victims(conn: AsyncConnection, victims: list[Victim]) -> bool:
    """Lock the victims' claims; False when one changed since the plan was read (no longer
    holding, already evicting, resized or moved off the card) or another transaction holds
    it. A locked victim is skipped, never waited for: the caller may hold a node's lock,
    and a resize or a delete of that victim takes its claim, then its node."""
    ids = sorted(v.claim_id for v in victims)
    locked = select(claims.c.id).where(
        claims.c.id.in_(ids), claims.c.status.in_(HOLDING_STATUSES), claims.c.evict_at.is_(None)
    )
    if len((await conn.execute(locked.with_for_update(skip_locked=True))).all()) < len(ids):
        return False
    held = select(vgpus.c.claim_id, vgpus.c.gpu_uuid, vgpus.c.vmemory_mib).where(
        vgpus.c.claim_id.in_(ids)
    )  # read after the locks: every change to these claims before them is committed
    now = {tuple(r) for r in (await conn.execute(held)).all()}
    return all((v.claim_id, v.gpu, v.mib) in now for v in victims)


async def start(
    conn: AsyncConnection, victims: list[Victim], for_claim: uuid.UUID, source: str
) -> str:
    """Mark the victims evicting (event, record); returns the waiting claim's reason. They
    all leave at the end of the longest of their classes' grace periods: one that left
    earlier would be placed back into the room before the others left, and the waiting
    claim would evict it again, and again."""
    grace_s = max(v.grace_s for v in victims)
    grace = timedelta(seconds=grace_s)
    for victim in victims:
        await conn.execute(
            update(claims).where(claims.c.id == victim.claim_id).values(evict_at=func.now() + grace)
        )
        reason = f"{EVICTED_FOR}{for_claim}"
        await conn.execute(insert(preemptions).values(
            claim_id=victim.claim_id, tenant=victim.tenant, gpu_uuid=victim.gpu,
            node_name=victim.node, kind="eviction", reason=reason, for_claim=for_claim,
        ))  # fmt: skip
        await emit(conn, source, victim.claim_id, "evicting")
    cards = ", ".join(dict.fromkeys(v.gpu for v in victims))
    where = f"card {cards}" if "," not in cards else f"cards {cards}"
    return (
        f"waiting for {len(victims)} low-priority claim(s) to be evicted from {where} "
        f"(grace {grace_s:g} s)"
    )


async def finish_due(conn: AsyncConnection, source: str) -> tuple[int, list[uuid.UUID]]:
    """Release the victims whose grace period is over and make them pending again; returns
    how many, and the pending claims they were evicted for, locked, for the caller to place
    in this transaction (else the room could go to a low-priority claim first). A victim
    whose claim waits no more (deleted, placed elsewhere, failed) is kept where it is."""
    due = (
        await conn.execute(
            select(claims)
            .where(claims.c.status.in_(HOLDING_STATUSES), claims.c.evict_at <= func.now())
            .with_for_update(skip_locked=True)
        )
    ).all()
    await _end_records_of_departed(conn)
    if not due:
        return 0, []
    victims = [row.id for row in due]
    made_room_for = await _evicted_for(conn, victims)
    waiting = await _lock_waiting(conn, set(made_room_for.values()))
    kept = [row for row in due if made_room_for.get(row.id) not in waiting]
    await _call_off(conn, source, kept, made_room_for)
    due = [row for row in due if row.id not in {k.id for k in kept}]
    reason = "evicted for a high-priority claim; waiting to be placed again"
    for row in due:
        await transition(conn, source, row, ClaimStatus.PENDING, reason, release=True,
                         node_name=None, evict_at=None)  # fmt: skip
    await conn.execute(
        update(preemptions).where(_open_eviction_of(victims)).values(ended_at=func.now())
    )
    return len(due), waiting


async def _call_off(
    conn: AsyncConnection, source: str, kept: list[Any], made_room_for: dict[uuid.UUID, Any]
) -> None:
    """The claim `kept` were evicted for waits no more: they keep their vGPUs, and their
    watchers, who saw `evicting`, get their status's event again saying so (`evict_at` null)."""
    for row in kept:
        reason = f"{CALLED_OFF}{made_room_for.get(row.id)} no longer waits"
        await transition(conn, source, row, ClaimStatus(row.status), reason, evict_at=None)


def _open_eviction_of(victims: Any) -> Any:
    """The open eviction records of `victims` (a list of claim ids, or a select of them)."""
    return and_(preemptions.c.claim_id.in_(victims), preemptions.c.kind == "eviction",
                preemptions.c.ended_at.is_(None))  # fmt: skip


async def _evicted_for(conn: AsyncConnection, victims: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """The claim each of `victims` is being evicted for, by its open eviction record."""
    query = select(preemptions.c.claim_id, preemptions.c.for_claim).where(
        _open_eviction_of(victims)
    )
    return {row.claim_id: row.for_claim for row in (await conn.execute(query)).all()}


async def _end_records_of_departed(conn: AsyncConnection) -> None:
    """End the open eviction and operator records of claims that no longer hold vGPUs: a
    victim that left before its grace was over (deleted, failed), a claim deleted or evicted
    while an operator held it suspended (no resume can reach it now). Nothing else would, and
    the listing would show them open for good. Gang records are the preemptor's, ended when
    their cards go idle."""
    departed = select(claims.c.id).where(claims.c.status.not_in(HOLDING_STATUSES))
    gone = and_(preemptions.c.claim_id.in_(departed), preemptions.c.ended_at.is_(None),
                preemptions.c.kind.in_(("eviction", "operator")))  # fmt: skip
    await conn.execute(update(preemptions).where(gone).values(ended_at=func.now()))


async def _lock_waiting(conn: AsyncConnection, claim_ids: set[Any]) -> list[uuid.UUID]:
    """Those of `claim_ids` (what victims were evicted for) that still wait, pending at high
    priority, locked in id order before any node is: a sweep holding one finishes first (it
    finds the victims still there and evicts no more), as a resize or delete of it does (they
    take the claim, then the node)."""
    query = (
        select(claims.c.id)
        .where(
            claims.c.id.in_(claim_ids),
            claims.c.status == ClaimStatus.PENDING.value,
            claims.c.priority == Priority.HIGH.value,
        )
        .order_by(claims.c.id)
        .with_for_update()
    )
    return list((await conn.execute(query)).scalars().all())
