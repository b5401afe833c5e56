"""Reading, from the allocator's inventory, which low-priority vGPUs must stop together: every
vGPU of a multi-card claim, and every vGPU of one tenant's claims sharing a gang name (a gang
is its tenant's: another tenant naming it joins nothing)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import ColumnElement, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, Priority
from qshare.contracts.schema import claims, gpus, nodes, vgpus


@dataclass(frozen=True)
class Member:
    claim_id: uuid.UUID
    tenant: str
    node: str
    gpu: str
    local_id: int


async def gang_of_card(conn: AsyncConnection, gpu: str) -> list[Member]:
    """Every vGPU that must stop with the low-priority gangs holding a vGPU on `gpu` (one
    statement: it runs on the path from a busy card to its gangs being suspended). A gang
    is named within its tenant: the same name of another tenant is another gang."""
    on_card = (
        select(claims.c.id, claims.c.tenant, claims.c.gang)
        .join(vgpus, vgpus.c.claim_id == claims.c.id)
        .where(
            vgpus.c.gpu_uuid == gpu,
            claims.c.priority == Priority.LOW.value,
            claims.c.status.in_(HOLDING_STATUSES),
            or_(claims.c.count > 1, claims.c.gang.is_not(None)),
        )
        .cte("on_card")
    )
    chosen = or_(
        claims.c.id.in_(select(on_card.c.id)),
        tuple_(claims.c.tenant, claims.c.gang).in_(
            select(on_card.c.tenant, on_card.c.gang).where(on_card.c.gang.is_not(None))
        ),
    )
    return await _members(conn, chosen)


async def card_owner(conn: AsyncConnection, gpu: str) -> str | None:
    """The node of card `gpu` in the inventory (None: no such card)."""
    query = select(gpus.c.node_name).where(gpus.c.uuid == gpu)
    return (await conn.execute(query)).scalar_one_or_none()


async def known_cards(conn: AsyncConnection, cards: set[str]) -> set[str]:
    """Those of `cards` that are cards of the inventory."""
    if not cards:
        return set()
    query = select(gpus.c.uuid).where(gpus.c.uuid.in_(cards))
    return set((await conn.execute(query)).scalars().all())


async def existing_nodes(conn: AsyncConnection, names: list[str]) -> set[str]:
    """Those of `names` that are nodes of the inventory."""
    query = select(nodes.c.name).where(nodes.c.name.in_(names))
    return set((await conn.execute(query)).scalars().all())


async def vgpus_of_claim(conn: AsyncConnection, claim_id: uuid.UUID) -> list[Member]:
    return await _members(conn, claims.c.id == claim_id)


async def vgpus_of_claims(conn: AsyncConnection, claim_ids: list[uuid.UUID]) -> list[Member]:
    return await _members(conn, claims.c.id.in_(claim_ids))


async def _members(conn: AsyncConnection, chosen: ColumnElement[bool]) -> list[Member]:
    query = (
        select(claims.c.id, claims.c.tenant, vgpus.c.node_name, vgpus.c.gpu_uuid, vgpus.c.local_id)
        .join(vgpus, vgpus.c.claim_id == claims.c.id)
        .where(chosen, claims.c.status.in_(HOLDING_STATUSES))
    )
    return [
        Member(r.id, r.tenant, r.node_name, r.gpu_uuid, r.local_id)
        for r in (await conn.execute(query)).all()
    ]
