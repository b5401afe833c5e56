"""Reading cards with their allocated and free capacity and their sharing."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.card_rows import gpu_views
from qshare.contracts.nodes import GpuView


async def list_gpus(
    conn: AsyncConnection,
    node: str | None,
    after: tuple[str, int] | None = None,
    limit: int | None = None,
) -> list[GpuView]:
    return await gpu_views(conn, node=node, after=after, limit=limit)


async def get_gpu(conn: AsyncConnection, uuid: str) -> GpuView | None:
    found = await gpu_views(conn, uuid=uuid)
    return found[0] if found else None
