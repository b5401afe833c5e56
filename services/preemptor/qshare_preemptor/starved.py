"""Postgres side of the starvation watch: which low-priority vGPUs of a node are watched
(their class has a `starvation_share` above 0), and the `starvations` records."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, Priority
from qshare.contracts.schema import claims, classes, gpus, starvations, vgpus

Key = tuple[uuid.UUID, str]
"""(claim, card) of an open record."""


@dataclass(frozen=True)
class Watched:
    claim_id: uuid.UUID
    tenant: str
    node: str
    gpu: str
    local_id: int
    cards: int
    threshold: float
    movable: bool


async def node_cards(conn: AsyncConnection, node: str) -> set[str]:
    query = select(gpus.c.uuid).where(gpus.c.node_name == node)
    return set((await conn.execute(query)).scalars().all())


async def any_watched_class(conn: AsyncConnection) -> bool:
    query = select(classes.c.name).where(classes.c.starvation_share > 0).limit(1)
    return (await conn.execute(query)).first() is not None


async def watched(conn: AsyncConnection, node: str) -> list[Watched]:
    query = (
        select(
            claims.c.id,
            claims.c.tenant,
            claims.c.count.label("cards"),
            vgpus.c.gpu_uuid,
            vgpus.c.local_id,
            classes.c.starvation_share,
            classes.c.move_on_starvation,
        )
        .join(vgpus, vgpus.c.claim_id == claims.c.id)
        .join(classes, classes.c.name == claims.c.class_name)
        .where(
            vgpus.c.node_name == node,
            claims.c.priority == Priority.LOW.value,
            claims.c.status.in_(HOLDING_STATUSES),
            classes.c.starvation_share > 0,
        )
    )
    return [
        Watched(
            r.id,
            r.tenant,
            node,
            r.gpu_uuid,
            r.local_id,
            r.cards,
            r.starvation_share,
            r.move_on_starvation,
        )
        for r in (await conn.execute(query)).all()
    ]


async def open_on(conn: AsyncConnection, node: str) -> dict[Key, int]:
    query = select(starvations.c.id, starvations.c.claim_id, starvations.c.gpu_uuid).where(
        starvations.c.node_name == node, starvations.c.ended_at.is_(None)
    )
    return {(r.claim_id, r.gpu_uuid): r.id for r in (await conn.execute(query)).all()}


async def open_record(
    conn: AsyncConnection, claim: Watched, share: float, harvestable: float, window_s: float
) -> int:
    values = {
        "claim_id": claim.claim_id,
        "tenant": claim.tenant,
        "gpu_uuid": claim.gpu,
        "node_name": claim.node,
        "share": share,
        "harvestable_share": harvestable,
        "window_s": window_s,
    }
    query = insert(starvations).values(values).returning(starvations.c.id)
    return int((await conn.execute(query)).scalar_one())


async def close(conn: AsyncConnection, ids: list[int], moved_to: str | None = None) -> None:
    if ids:
        await conn.execute(
            update(starvations)
            .where(starvations.c.id.in_(ids), starvations.c.ended_at.is_(None))
            .values(ended_at=func.now(), moved_to=moved_to)
        )


async def note(conn: AsyncConnection, record: int, text: str) -> None:
    query = update(starvations).where(starvations.c.id == record).values(note=text[:253])
    await conn.execute(query)
