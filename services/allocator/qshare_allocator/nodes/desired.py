"""A node's desired state as stored: every vGPU of a claim that holds capacity on it (and
whether the control plane holds it suspended), and the sharing admins asked of its cards."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    ScalarSelect,
    Select,
    Text,
    and_,
    bindparam,
    exists,
    func,
    null,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, array
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.agent import ApplyDesired, DesiredVgpu
from qshare.contracts.domain import (
    APPLY_SHARING_FEATURE,
    APPLY_SUSPENDED_FEATURE,
    HOLDING_STATUSES,
    Priority,
    agent_features,
)
from qshare.contracts.errors import NotFound
from qshare.contracts.schema import claims, gpus, nodes, preemptions, vgpus
from qshare.contracts.sharing import SharingSettings, WantedSharing


async def desired_state(conn: AsyncConnection, node: str) -> ApplyDesired | None:
    """The node's whole desired set at its current generation, in one statement (its own
    snapshot); None for a node no agent registered (an inventory entry made over REST:
    placement only)."""
    rows = (await conn.execute(_desired(), {"d_node": node})).all()
    if not rows:
        raise NotFound(f"node {node} is not registered")
    if rows[0].segment is None:
        return None
    features = agent_features(rows[0].labels)
    flagged = APPLY_SUSPENDED_FEATURE in features  # an earlier agent refuses the flag
    wanted = [
        DesiredVgpu(
            local_id=r.local_id,
            id=r.id,
            claim_id=r.claim_id,
            gpu=r.gpu_uuid,
            priority=Priority(r.priority),
            vcore=r.vcore,
            vmemory_mib=r.vmemory_mib,
            suspended=flagged and r.suspended,
        )
        for r in rows
        if r.local_id is not None
    ]
    sharing = _wanted_sharing(rows[0].asked or {}, features)
    generation = int(rows[0].desired_generation)
    return ApplyDesired(node=node, generation=generation, vgpus=wanted, sharing=sharing)


@functools.cache
def _desired() -> Select[Any]:
    """The statement of `desired_state`, built once (it runs after every change of a node)."""
    held = vgpus.join(
        claims, and_(claims.c.id == vgpus.c.claim_id, claims.c.status.in_(HOLDING_STATUSES))
    )
    return (
        select(
            nodes.c.desired_generation,
            nodes.c.segment,
            nodes.c.labels,
            _asked().label("asked"),
            vgpus,
            _held().label("suspended"),
        )
        .select_from(nodes.outerjoin(held, vgpus.c.node_name == nodes.c.name))
        .where(nodes.c.name == bindparam("d_node"))
        .order_by(vgpus.c.local_id)
    )


def _held() -> ColumnElement[bool]:
    """Whether the control plane holds the row's vGPU suspended, from the open preemption
    records of its claim: an operator's, or its gang's while a busy card holds it, but the
    vGPU on the card whose busy episode opened the record while that card alone is busy
    (the preemptor leaves it to the driver, which stops low priority there the moment high
    priority launches; it suspends it once another card of the gang goes busy)."""
    busy = func.coalesce(
        preemptions.c.busy_gpus,
        func.array_remove(array([preemptions.c.gpu_uuid]), null(), type_=ARRAY(Text)),
        type_=ARRAY(Text),
    )
    own = vgpus.c.gpu_uuid
    others = func.cardinality(func.array_remove(busy, own, type_=ARRAY(Text))) > 0
    opened_elsewhere = and_(
        func.cardinality(busy) > 0, preemptions.c.gpu_uuid.is_distinct_from(own)
    )
    holding = or_(
        preemptions.c.kind == "operator",
        and_(preemptions.c.kind == "gang", or_(others, opened_elsewhere)),
    )
    return exists().where(
        preemptions.c.claim_id == vgpus.c.claim_id, preemptions.c.ended_at.is_(None), holding
    )


def _wanted_sharing(asked: dict[str, Any], features: frozenset[str]) -> list[WantedSharing]:
    """What is asked of the node's cards, if its agent can take it: an agent of an earlier
    version (one downgraded after the request) refuses any apply that carries it, so it gets
    none, and the request stays pending until the agent is upgraded."""
    if APPLY_SHARING_FEATURE not in features:
        return []
    return [
        WantedSharing(gpu=gpu, settings=SharingSettings.model_validate(settings))
        for gpu, settings in sorted(asked.items())
    ]


def _asked() -> ScalarSelect[Any]:
    """{card: sharing asked} of the node's cards in service, read in the same statement as
    the generation (so an apply never confirms a generation without what it asked)."""
    return (
        select(func.jsonb_object_agg(gpus.c.uuid, gpus.c.sharing_requested, type_=JSONB))
        .where(
            gpus.c.node_name == nodes.c.name,
            gpus.c.sharing_requested.is_not(None),
            gpus.c.retired.is_(False),
        )
        .scalar_subquery()
    )
