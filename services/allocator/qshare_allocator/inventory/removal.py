"""Removing a card or a node, and what happens to the claims on it: each claim holding a
vGPU there gives all its capacity back and turns `failed`, with a reason and an event
(`qshare.evt.claim.<id>.failed`); a `releasing` claim on a removed node is `released`. The
caller locks those claims (`lock_claims_first`) before the node's row, the order a delete,
a resize and a move take them in, so a removal never deadlocks with one of them; then it
holds the node's row lock and commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus
from qshare.contracts.schema import claims, gpus, vgpus
from qshare_allocator.claims.transitions import release, transition


async def lock_claims_first(
    conn: AsyncConnection, node: str, card_uuids: list[str] | None = None
) -> None:
    """Lock the claims a removal of `card_uuids` (None: the whole node) may change, before
    the caller locks the node: those holding a vGPU there and, for a node, its releasing
    ones. A claim placed there between this and the node's lock is locked after it."""
    on = vgpus.c.node_name == node if card_uuids is None else vgpus.c.gpu_uuid.in_(card_uuids)
    where: ColumnElement[bool] = claims.c.id.in_(select(vgpus.c.claim_id).where(on))
    if card_uuids is None:
        releasing = claims.c.status == ClaimStatus.RELEASING.value
        where = or_(where, and_(claims.c.node_name == node, releasing))
    await conn.execute(select(claims.c.id).where(where).order_by(claims.c.id).with_for_update())


async def fail_claims_on(
    conn: AsyncConnection, source: str, card_uuids: list[str], reason: str
) -> list[Any]:
    """Fail every claim holding a vGPU on one of `card_uuids`; returns their ids."""
    on_cards = select(vgpus.c.claim_id).where(vgpus.c.gpu_uuid.in_(card_uuids))
    query = (
        select(claims)
        .where(claims.c.id.in_(on_cards), claims.c.status.in_(HOLDING_STATUSES))
        .order_by(claims.c.id)
        .with_for_update()
    )
    rows = (await conn.execute(query)).all()
    for row in rows:
        await _fail(conn, source, row, reason)
    return [row.id for row in rows]


async def remove_cards(
    conn: AsyncConnection, source: str, node: str, uuids: list[str]
) -> list[Any]:
    """Delete the cards after failing the claims on them; returns the failed claims' ids."""
    failed = await fail_claims_on(conn, source, uuids, f"card removed from node {node}")
    await conn.execute(delete(gpus).where(gpus.c.node_name == node, gpus.c.uuid.in_(uuids)))
    return failed


async def release_waiting_on(conn: AsyncConnection, source: str, node: str) -> None:
    """Release the claims waiting for `node` to confirm their removal (it is being removed)."""
    query = select(claims).where(
        claims.c.node_name == node, claims.c.status == ClaimStatus.RELEASING.value
    )
    for row in (await conn.execute(query.with_for_update())).all():
        await release(conn, source, row, f"node {node} was removed")


async def _fail(conn: AsyncConnection, source: str, row: Any, reason: str) -> None:
    await transition(conn, source, row, ClaimStatus.FAILED, reason, release=True)
