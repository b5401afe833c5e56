"""Reading nodes and cards, with their readiness and allocated and free capacity."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Row, select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import MAX_CORE_SHARE
from qshare.contracts.nodes import CardSharing, GpuView
from qshare.contracts.schema import gpus

log = logging.getLogger(__name__)


async def list_gpus(conn: AsyncConnection, node: str | None) -> list[GpuView]:
    query = select(gpus).order_by(gpus.c.node_name, gpus.c.idx)
    if node is not None:
        query = query.where(gpus.c.node_name == node)
    return [_gpu(r) for r in (await conn.execute(query)).all()]


def _gpu(r: Row[Any]) -> GpuView:
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
        sharing=_sharing(r.uuid, r.sharing),
    )


def _sharing(card: str, stored: dict[str, Any] | None) -> CardSharing | None:
    """What the card's node reported; None when it has not, or when the report stored is not
    one this API reads (a newer agent's): the card is still listed."""
    if stored is None:
        return None
    try:
        return CardSharing.model_validate({**stored, "gpu": card})
    except ValidationError as exc:
        log.warning("card %s: its sharing report is not readable here (%s)", card, exc)
        return None
