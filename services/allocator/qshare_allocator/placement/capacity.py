"""Holding and giving back card capacity; callers hold the node's row lock."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    Text,
    any_,
    bindparam,
    case,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import UpdateBase

from qshare.contracts.claims import VgpuView
from qshare.contracts.domain import Priority
from qshare.contracts.schema import gpus, nodes, vgpus
from qshare_allocator.placement.demand import Demand
from qshare_allocator.placement.finder import Choice


@dataclass(frozen=True)
class Holding:
    """The vGPUs a claim gets, the statements recording them against cards and node, and
    their parameters (statements are built once per shape)."""

    vgpus: list[VgpuView]
    statements: tuple[UpdateBase, ...]
    params: dict[str, Any]


def holding(claim_id: uuid.UUID, demand: Demand, choice: Choice) -> Holding:
    """Create the claim's vGPUs on the chosen cards (the caller holds the node's lock)."""
    views = [
        _vgpu(claim_id, demand, choice.node, card.uuid, card.idx, card.memory_mib)
        for card in choice.cards
    ]
    params: dict[str, Any] = {
        "h_uuids": [v.gpu for v in views],
        "h_mib": demand.vmemory_mib,
        "h_core": demand.card_vcore,
        "h_node": choice.node,
        "h_taken": sum(v.vmemory_mib for v in views),
        "h_node_core": demand.card_vcore * len(views),
    }
    for i, view in enumerate(views):
        params |= {f"v{i}_{k}": value for k, value in _vgpu_row(claim_id, view).items()}
    return Holding(views, _statements(demand.priority, demand.whole, len(views)), params)


@functools.cache
def _statements(priority: Priority, whole: bool, count: int) -> tuple[UpdateBase, ...]:
    high = priority is Priority.HIGH
    core = bindparam("h_core", type_=Integer)
    cards = (
        update(gpus)
        .where(gpus.c.uuid == any_(bindparam("h_uuids", type_=ARRAY(Text))))  # no expanding
        .values(
            allocated_mib=gpus.c.memory_mib if whole else gpus.c.allocated_mib + bindparam("h_mib"),
            core_high=gpus.c.core_high + core if high else gpus.c.core_high,
            core_low=gpus.c.core_low if high else gpus.c.core_low + core,
            vgpu_count=gpus.c.vgpu_count + 1,
        )
    )
    taken = nodes.c.free_mib - bindparam("h_taken", type_=Integer)
    node_core = bindparam("h_node_core", type_=Integer)
    node = (
        update(nodes)
        .where(nodes.c.name == bindparam("h_node"))
        .values(
            free_mib=taken,
            desired_generation=nodes.c.desired_generation + 1,
            core_high=nodes.c.core_high + node_core if high else nodes.c.core_high,
            core_low=nodes.c.core_low if high else nodes.c.core_low + node_core,
        )
    )
    slices = [
        insert(vgpus).values({c: bindparam(f"v{i}_{c}") for c in VGPU_COLUMNS})
        for i in range(count)
    ]
    return (cards, node, *slices)


async def give_back(conn: AsyncConnection, claim_id: uuid.UUID, node: str) -> bool:
    """Delete the claim's vGPUs and return their capacity (lock the node first); False when
    it held none."""
    await conn.execute(select(nodes.c.name).where(nodes.c.name == node).with_for_update())
    held = (
        await conn.execute(delete(vgpus).where(vgpus.c.claim_id == claim_id).returning(vgpus))
    ).all()
    if not held:
        return False
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
    high = sum(r.vcore for r in held if r.priority == "high")
    low = sum(r.vcore for r in held if r.priority != "high")
    await adjust_node(conn, node, sum(r.vmemory_mib for r in held), high, low)
    return True


async def adjust_node(
    conn: AsyncConnection, node: str, delta_mib: int, high: int, low: int
) -> None:
    """`node` gets `delta_mib` of memory and `high`/`low` core share back (negative: takes
    more), and a new desired generation for its agent to apply."""
    await conn.execute(
        update(nodes)
        .where(nodes.c.name == node)
        .values(
            free_mib=nodes.c.free_mib + delta_mib,
            desired_generation=nodes.c.desired_generation + 1,
            core_high=nodes.c.core_high - high,
            core_low=nodes.c.core_low - low,
        )
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


VGPU_COLUMNS = (
    "id",
    "claim_id",
    "gpu_uuid",
    "node_name",
    "idx",
    "priority",
    "vcore",
    "vmemory_mib",
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
