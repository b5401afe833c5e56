"""A card's sharing as an admin asks for it: kept in `gpus.sharing_requested` and carried to
the node agent with the node's desired state (a new generation), so it reaches the card now
and again after every agent restart; the agent's answers record how the card is shared."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, case, null, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.agent import ApplyReply
from qshare.contracts.card_rows import gpu_views
from qshare.contracts.domain import APPLY_SHARING_FEATURE, agent_features
from qshare.contracts.errors import Conflict, NotFound
from qshare.contracts.nodes import GpuView
from qshare.contracts.schema import gpus, nodes
from qshare.contracts.sharing import CardSharing, ChangeSharing, SharingSettings


async def ask_sharing(conn: AsyncConnection, command: ChangeSharing) -> GpuView:
    """Record what is asked of the card (its node's row locked first, as placement does) and
    give the node a new desired generation; the caller commits, then dispatches the node."""
    node = await _lock_node_of(conn, command.uuid, asking=command.change is not None)
    before = await _locked_request(conn, command.uuid, node)
    asked = None if command.change is None else command.change.over(_read(before))
    stored = None if asked is None else asked.model_dump(mode="json", exclude_none=True)
    if stored != before:
        generation = (
            await conn.execute(
                update(nodes)
                .where(nodes.c.name == node)
                .values(desired_generation=nodes.c.desired_generation + 1)
                .returning(nodes.c.desired_generation)
            )
        ).scalar_one()
        await conn.execute(
            update(gpus)
            .where(gpus.c.uuid == command.uuid)
            .values(
                sharing_requested=null() if stored is None else stored,  # SQL NULL, not JSON's
                sharing_refused=None,
                sharing_generation=generation,
            )
        )
    return (await gpu_views(conn, uuid=command.uuid))[0]


async def _lock_node_of(conn: AsyncConnection, uuid: str, asking: bool) -> str:
    """The card's node, its row locked; Conflict for a node no agent registered and, when
    `asking` (not withdrawing), for a node whose agent cannot take the request."""
    query = (
        select(nodes.c.name, nodes.c.segment, nodes.c.labels)
        .join(gpus, gpus.c.node_name == nodes.c.name)
        .where(gpus.c.uuid == uuid)
        .with_for_update(of=nodes)
    )
    row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise NotFound(f"card {uuid} not found")
    if row.segment is None:
        raise Conflict(
            f"card {uuid}: node {row.name} has no node agent to share it (its inventory was "
            "made over REST)"
        )
    if asking and APPLY_SHARING_FEATURE not in agent_features(row.labels):
        raise Conflict(
            f"card {uuid}: node {row.name}'s agent is of an earlier version, which cannot "
            "take sharing requests; upgrade its node agent first"
        )
    return str(row.name)


async def _locked_request(conn: AsyncConnection, uuid: str, node: str) -> Any:
    """What is asked of the card now, its row locked; NotFound when, once its node's lock
    was had, the card is no longer that node's (removed, or registered elsewhere)."""
    query = select(gpus.c.uuid, gpus.c.sharing_requested).where(
        gpus.c.uuid == uuid, gpus.c.node_name == node
    )
    row = (await conn.execute(query.with_for_update())).one_or_none()
    if row is None:
        raise NotFound(f"card {uuid} not found")
    return row.sharing_requested


def _read(stored: object) -> SharingSettings | None:
    return None if stored is None else SharingSettings.model_validate(stored)


async def record_sharing(conn: AsyncConnection, node: str, sharing: list[CardSharing]) -> None:
    """How the node's own cards are shared, written where it changed (a card of another node
    named here is left alone)."""
    if not sharing:
        return
    reported = bindparam("reported", type_=JSONB)
    changed = (
        update(gpus)
        .where(
            gpus.c.node_name == node,
            gpus.c.uuid == bindparam("card"),
            gpus.c.sharing.is_distinct_from(reported),
        )
        .values(sharing=reported)
    )
    rows = [
        {"card": s.gpu, "reported": s.model_dump(mode="json", exclude={"gpu"})} for s in sharing
    ]
    await conn.execute(changed, rows)


async def record_apply(conn: AsyncConnection, reply: ApplyReply) -> None:
    """An apply's answer about sharing: each card as now shared, and why the node could not
    share one as asked (cleared for the others). An earlier agent's answer carries neither."""
    if reply.stale or not reply.sharing:
        return
    await record_sharing(conn, reply.node, reply.sharing)
    refused = {r.gpu: r.reason for r in reply.sharing_refused}
    reason = case(refused, value=gpus.c.uuid, else_=None) if refused else None
    await conn.execute(
        update(gpus)
        .where(
            gpus.c.node_name == reply.node,
            gpus.c.uuid.in_([s.gpu for s in reply.sharing]),
            gpus.c.sharing_refused.is_distinct_from(reason),
        )
        .values(sharing_refused=reason)
    )
