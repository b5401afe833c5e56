"""Rows of the shared schema turned into the view contracts (used by allocator and api)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.claims import ClaimSuspension, ClaimView, PlacementOverride, VgpuView
from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus, NodeStatus, Priority
from qshare.contracts.nodes import NodeView
from qshare.contracts.schema import claims, gpus, nodes, preemptions, vgpus


def claim_view(
    row: Row[Any], held: list[VgpuView], suspended: ClaimSuspension | None = None
) -> ClaimView:
    return ClaimView(
        id=row.id,
        tenant=row.tenant,
        status=ClaimStatus(row.status),
        priority=Priority(row.priority),
        vcore=row.vcore,
        vmemory_mib=row.vmemory_mib,
        count=row.count,
        class_name=row.class_name,
        node_selector=row.node_selector,
        placement=PlacementOverride.model_validate(row.placement) if row.placement else None,
        idempotency_key=row.idempotency_key,
        reason=row.reason,
        node=row.node_name,
        vgpus=held,
        gang=row.gang,
        evict_at=row.evict_at,
        suspended=suspended,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def vgpu_view(row: Row[Any]) -> VgpuView:
    return VgpuView(
        id=row.id,
        node=row.node_name,
        gpu=row.gpu_uuid,
        index=row.idx,
        vcore=row.vcore,
        vmemory_mib=row.vmemory_mib,
        priority=Priority(row.priority),
        local_id=row.local_id,
        segment=getattr(row, "segment", None),
        shm_dir=getattr(row, "shm_dir", None),
    )


async def vgpus_of(
    conn: AsyncConnection, claim_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[VgpuView]]:
    """The vGPUs of each claim, ordered by card index."""
    if not claim_ids:
        return {}
    query = (
        select(vgpus, nodes.c.segment, nodes.c.shm_dir)
        .join(nodes, nodes.c.name == vgpus.c.node_name, isouter=True)
        .where(vgpus.c.claim_id.in_(claim_ids))
        .order_by(vgpus.c.idx)
    )
    found: dict[uuid.UUID, list[VgpuView]] = {}
    for row in (await conn.execute(query)).all():
        found.setdefault(row.claim_id, []).append(vgpu_view(row))
    return found


SUSPENDING_KINDS = ("operator", "gang")
"""Preemption records that hold a claim's vGPUs stopped, the one shown first where a claim
has both (an operator's outlasts its gang's: only a resume ends it). An `eviction` record
stops nothing during the grace (the claim's `evict_at` says it is being evicted)."""


async def suspensions_of(
    conn: AsyncConnection, claim_ids: list[uuid.UUID]
) -> dict[uuid.UUID, ClaimSuspension]:
    """Each claim's suspension among `claim_ids`, from their open records in one query."""
    if not claim_ids:
        return {}
    query = (
        select(preemptions)
        .where(
            preemptions.c.claim_id.in_(claim_ids),
            preemptions.c.ended_at.is_(None),
            preemptions.c.kind.in_(SUSPENDING_KINDS),
        )
        .order_by(preemptions.c.started_at, preemptions.c.id)
    )
    found: dict[uuid.UUID, ClaimSuspension] = {}
    for row in (await conn.execute(query)).all():
        kept = found.get(row.claim_id)  # the oldest of the first kind
        if kept is None or SUSPENDING_KINDS.index(row.kind) < SUSPENDING_KINDS.index(kept.kind):
            found[row.claim_id] = _suspension(row)
    return found


def _suspension(row: Row[Any]) -> ClaimSuspension:
    cards = row.busy_gpus if row.busy_gpus is not None else [row.gpu_uuid] if row.gpu_uuid else []
    return ClaimSuspension(
        kind=row.kind, since=row.started_at, reason=row.reason, by=row.suspended_by,
        cards=cards if row.kind == "gang" else None, preemption=row.id,
    )  # fmt: skip


async def claim_views(conn: AsyncConnection, rows: list[Row[Any]]) -> list[ClaimView]:
    """Views of claim rows with their vGPUs and, for those holding them, their suspension:
    three queries at most, however many rows."""
    held = await vgpus_of(conn, [r.id for r in rows])
    holding = [r.id for r in rows if r.status in HOLDING_STATUSES]
    stopped = await suspensions_of(conn, holding)
    return [claim_view(r, held.get(r.id, []), stopped.get(r.id)) for r in rows]


def node_is_ready() -> ColumnElement[bool]:
    """True for a node whose last heartbeat is younger than the parameter `node_timeout_s`
    (seconds), on the database's clock."""
    return nodes.c.heartbeat_at >= func.now() - text("make_interval(secs => :node_timeout_s)")


async def node_views(
    conn: AsyncConnection,
    timeout_s: float,
    name: str | None = None,
    after: str | None = None,
    limit: int | None = None,
) -> list[NodeView]:
    """Nodes by name with readiness and capacity summed over their cards: one named, or the
    first `limit` (None: all) whose name sorts after `after`."""
    query = (
        select(
            nodes,
            node_is_ready().label("ready"),
            func.count(gpus.c.uuid).label("cards"),
            func.coalesce(func.sum(gpus.c.memory_mib), 0).label("memory_mib"),
        )
        .join(gpus, gpus.c.node_name == nodes.c.name, isouter=True)
        .group_by(nodes.c.name)
        .order_by(nodes.c.name)
    )
    if name is not None:
        query = query.where(nodes.c.name == name)
    if after is not None:
        query = query.where(nodes.c.name > after)
    rows = (await conn.execute(query.limit(limit), {"node_timeout_s": timeout_s})).all()
    return [_node_view(r) for r in rows]


def _node_view(row: Row[Any]) -> NodeView:
    return NodeView(
        name=row.name,
        status=NodeStatus.READY if row.ready else NodeStatus.NOT_READY,
        labels=row.labels,
        schedulable=row.schedulable,
        heartbeat_at=row.heartbeat_at,
        gpus=row.cards,
        memory_mib=row.memory_mib,
        free_mib=row.free_mib,
    )


QUOTA_COUNTED = (ClaimStatus.PENDING.value, ClaimStatus.PLACED.value, ClaimStatus.READY.value)
"""Claims a tenant's quota counts: every claim not yet released or failed, pending ones too."""


def quota_usage(tenant: str) -> Select[Any]:
    """What `tenant`'s claims use of its quota: `memory_mib`, `cards` (vGPUs), `pending`."""
    counted = claims.c.status.in_(QUOTA_COUNTED)
    memory = func.sum(claims.c.vmemory_mib * claims.c.count).filter(counted)
    return select(
        func.coalesce(memory, 0).label("memory_mib"),
        func.coalesce(func.sum(claims.c.count).filter(counted), 0).label("cards"),
        func.count().filter(claims.c.status == ClaimStatus.PENDING.value).label("pending"),
    ).where(claims.c.tenant == tenant)
