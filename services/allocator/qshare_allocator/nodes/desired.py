"""A node's desired state as stored: every vGPU of a claim that holds capacity on it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.agent import ApplyDesired, DesiredVgpu
from qshare.contracts.domain import HOLDING_STATUSES, Priority
from qshare.contracts.errors import NotFound
from qshare.contracts.schema import claims, nodes, vgpus


async def desired_state(conn: AsyncConnection, node: str) -> ApplyDesired | None:
    """The node's whole desired set at its current generation (read in one snapshot); None
    for a node no agent registered (an inventory entry made over REST: placement only)."""
    found = (
        await conn.execute(
            select(nodes.c.desired_generation, nodes.c.segment).where(nodes.c.name == node)
        )
    ).one_or_none()
    if found is None:
        raise NotFound(f"node {node} is not registered")
    if found.segment is None:
        return None
    generation = found.desired_generation
    query = (
        select(vgpus)
        .join(claims, claims.c.id == vgpus.c.claim_id)
        .where(vgpus.c.node_name == node, claims.c.status.in_(HOLDING_STATUSES))
        .order_by(vgpus.c.local_id)
    )
    rows = (await conn.execute(query)).all()
    wanted = [
        DesiredVgpu(
            local_id=r.local_id,
            id=r.id,
            claim_id=r.claim_id,
            gpu=r.gpu_uuid,
            priority=Priority(r.priority),
            vcore=r.vcore,
            vmemory_mib=r.vmemory_mib,
        )
        for r in rows
    ]
    return ApplyDesired(node=node, generation=int(generation), vgpus=wanted)
