"""Preemption records in Postgres: opened when the control plane suspends a claim, closed
when it resumes it; `GET /v1/preemptions` reads them."""

from __future__ import annotations

import uuid

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.schema import gpus, preemptions
from qshare_preemptor.gangs import Member, vgpus_of_claim


async def open_records(
    conn: AsyncConnection, members: list[Member], kind: str, reason: str, gpu: str | None
) -> None:
    """One open record per claim among `members` that has none of this kind yet."""
    claims = {m.claim_id: m for m in members}
    already = await open_claims(conn, list(claims), kind)
    rows = [
        {"claim_id": c, "tenant": m.tenant, "gpu_uuid": gpu, "node_name": m.node,
         "kind": kind, "reason": reason}
        for c, m in claims.items() if c not in already
    ]  # fmt: skip
    if rows:
        await conn.execute(insert(preemptions), rows)


async def close_records(conn: AsyncConnection, claim_ids: list[uuid.UUID], kind: str) -> None:
    await conn.execute(
        update(preemptions)
        .where(
            preemptions.c.claim_id.in_(claim_ids),
            preemptions.c.kind == kind,
            preemptions.c.ended_at.is_(None),
        )
        .values(ended_at=func.now())
    )


async def open_claims(
    conn: AsyncConnection, claim_ids: list[uuid.UUID], kind: str | None = None
) -> set[uuid.UUID]:
    """Claims among `claim_ids` with an open record (of `kind`, or of any kind)."""
    query = select(preemptions.c.claim_id).where(
        preemptions.c.claim_id.in_(claim_ids), preemptions.c.ended_at.is_(None)
    )
    if kind is not None:
        query = query.where(preemptions.c.kind == kind)
    return set((await conn.execute(query)).scalars().all())


async def open_gangs(conn: AsyncConnection) -> dict[uuid.UUID, tuple[str | None, list[Member]]]:
    """Each claim with an open `gang` record (not also held by an operator): the busy card its
    record names (None: it names none, or that card is no longer in the inventory) and the
    claim's vGPUs."""
    held = select(preemptions.c.claim_id).where(
        preemptions.c.ended_at.is_(None), preemptions.c.kind == "operator"
    )
    query = (
        select(preemptions.c.claim_id, gpus.c.uuid)
        .outerjoin(gpus, gpus.c.uuid == preemptions.c.gpu_uuid)
        .where(
            preemptions.c.ended_at.is_(None), preemptions.c.kind == "gang",
            preemptions.c.claim_id.not_in(held),
        )
        .order_by(preemptions.c.claim_id)
    )  # fmt: skip
    found: dict[uuid.UUID, tuple[str | None, list[Member]]] = {}
    for claim_id, card in (await conn.execute(query)).all():
        if claim_id not in found:
            found[claim_id] = (card, await vgpus_of_claim(conn, claim_id))
    return found
