"""Cards of the shared schema as `GpuView`s (the API lists them, the allocator answers a
sharing request with one): capacity, and sharing as reported and as asked."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy import Row, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import MAX_CORE_SHARE
from qshare.contracts.nodes import GpuView
from qshare.contracts.schema import gpus, nodes
from qshare.contracts.sharing import CardSharing, SharingSettings

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


async def gpu_views(
    conn: AsyncConnection,
    node: str | None = None,
    uuid: str | None = None,
    after: tuple[str, int] | None = None,
    limit: int | None = None,
) -> list[GpuView]:
    """Cards by node and index, of one node or one card when named; the first `limit` (None:
    all) after the card at `after` (node, index)."""
    query = (
        select(gpus, nodes.c.applied_generation)
        .join(nodes, nodes.c.name == gpus.c.node_name)
        .order_by(gpus.c.node_name, gpus.c.idx)
    )
    if node is not None:
        query = query.where(gpus.c.node_name == node)
    if uuid is not None:
        query = query.where(gpus.c.uuid == uuid)
    if after is not None:
        query = query.where(tuple_(gpus.c.node_name, gpus.c.idx) > tuple_(*after))
    return [gpu_view(r) for r in (await conn.execute(query.limit(limit))).all()]


def gpu_view(r: Row[Any]) -> GpuView:
    sharing = _stored(CardSharing, r.uuid, "sharing report", r.sharing, gpu=r.uuid)
    requested = _stored(SharingSettings, r.uuid, "requested sharing", r.sharing_requested)
    return GpuView(
        uuid=r.uuid,
        node=r.node_name,
        index=r.idx,
        model=r.model,
        memory_mib=r.memory_mib,
        healthy=r.healthy,
        retired=r.retired,
        max_vgpus=r.max_vgpus,
        vgpus=r.vgpu_count,
        allocated_mib=r.allocated_mib,
        free_mib=r.memory_mib - r.allocated_mib,
        core_high_used=r.core_high,
        core_low_used=r.core_low,
        core_high_free=MAX_CORE_SHARE - r.core_high,
        core_low_free=MAX_CORE_SHARE - r.core_low,
        sharing=sharing,
        sharing_requested=requested,
        sharing_pending=_pending(r.sharing_generation, r.applied_generation),
        sharing_refused=r.sharing_refused,
    )


def _pending(asked_at: int | None, applied: int) -> bool:
    """A request (or its withdrawal) the node has not confirmed: its generation not yet
    applied (again pending after the agent restarts, until its first apply)."""
    return asked_at is not None and applied < asked_at


def _stored(model: type[M], card: str, what: str, stored: Any, **extra: Any) -> M | None:
    """A JSON column read as `model`; None when empty, or when what is stored is not one this
    version reads (a newer agent's report): the card is still listed."""
    if stored is None:
        return None
    try:
        return model.model_validate({**stored, **extra})
    except ValidationError as exc:
        log.warning("card %s: its %s is not readable here (%s)", card, what, exc)
        return None
