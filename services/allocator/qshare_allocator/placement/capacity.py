"""Holding and giving back card capacity; callers hold the node's row lock."""

from __future__ import annotations

import uuid

from qshare.contracts.claims import VgpuView
from qshare.contracts.domain import Priority
from qshare.contracts.schema import gpus, nodes, vgpus
from sqlalchemy import Boolean, Integer, bindparam, case, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare_allocator.placement.demand import Demand
from qshare_allocator.placement.finder import Choice


async def hold(
    conn: AsyncConnection, claim_id: uuid.UUID, demand: Demand, choice: Choice
) -> list[VgpuView]:
    """Create the claim's vGPUs on the chosen cards and count them against the cards and node."""
    views = [
        _vgpu(claim_id, demand, choice.node, card.uuid, card.idx, card.memory_mib)
        for card in choice.cards
    ]
    high = demand.priority is Priority.HIGH
    await conn.execute(
        update(gpus)
        .where(gpus.c.uuid == bindparam("b_uuid"))
        .values(
            allocated_mib=gpus.c.allocated_mib + bindparam("b_mib", type_=Integer),
            core_high=gpus.c.core_high + (bindparam("b_core", type_=Integer) if high else 0),
            core_low=gpus.c.core_low + (0 if high else bindparam("b_core", type_=Integer)),
            vgpu_count=gpus.c.vgpu_count + 1,
        ),
        [{"b_uuid": v.gpu, "b_mib": v.vmemory_mib, "b_core": v.vcore} for v in views],
    )
    await _adjust_node(conn, choice.node, -sum(v.vmemory_mib for v in views))
    await conn.execute(insert(vgpus), [_vgpu_row(claim_id, v) for v in views])
    return views


async def give_back(conn: AsyncConnection, claim_id: uuid.UUID, node: str) -> None:
    """Delete the claim's vGPUs and return their capacity; lock the node first."""
    await conn.execute(select(nodes.c.name).where(nodes.c.name == node).with_for_update())
    held = (
        await conn.execute(delete(vgpus).where(vgpus.c.claim_id == claim_id).returning(vgpus))
    ).all()
    if not held:
        return
    await conn.execute(
        update(gpus)
        .where(gpus.c.uuid == bindparam("b_uuid"))
        .values(
            allocated_mib=gpus.c.allocated_mib - bindparam("b_mib", type_=Integer),
            core_high=gpus.c.core_high
            - case(
                (bindparam("b_high", type_=Boolean), bindparam("b_core", type_=Integer)), else_=0
            ),
            core_low=gpus.c.core_low
            - case(
                (bindparam("b_high", type_=Boolean), 0), else_=bindparam("b_core", type_=Integer)
            ),
            vgpu_count=gpus.c.vgpu_count - 1,
        ),
        [
            {
                "b_uuid": r.gpu_uuid,
                "b_mib": r.vmemory_mib,
                "b_core": r.vcore,
                "b_high": r.priority == "high",
            }
            for r in held
        ],
    )
    await _adjust_node(conn, node, sum(r.vmemory_mib for r in held))


async def _adjust_node(conn: AsyncConnection, node: str, delta_mib: int) -> None:
    await conn.execute(
        update(nodes).where(nodes.c.name == node).values(free_mib=nodes.c.free_mib + delta_mib)
    )


def _vgpu(
    claim_id: uuid.UUID, demand: Demand, node: str, gpu: str, idx: int, card_mib: int
) -> VgpuView:
    return VgpuView(
        id=uuid.uuid4(),
        node=node,
        gpu=gpu,
        index=idx,
        vcore=demand.card_vcore,
        vmemory_mib=card_mib if demand.whole else demand.vmemory_mib,
        priority=demand.priority,
    )


def _vgpu_row(claim_id: uuid.UUID, v: VgpuView) -> dict[str, object]:
    return {
        "id": v.id,
        "claim_id": claim_id,
        "gpu_uuid": v.gpu,
        "node_name": v.node,
        "idx": v.index,
        "priority": v.priority.value,
        "vcore": v.vcore,
        "vmemory_mib": v.vmemory_mib,
    }
