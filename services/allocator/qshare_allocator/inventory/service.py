"""Node registration and heartbeats inside one transaction; the caller commits.

Registration and heartbeats lock the node row before touching its cards, the same order
placement uses, so they never race a placement on the same card.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.errors import Conflict, NotFound
from qshare.contracts.nodes import GpuSpec, Heartbeat, NodeRegistration, NodeView
from qshare.contracts.rows import node_is_ready, node_views
from qshare.contracts.schema import gpus, nodes
from qshare.settings import ClusterSettings


class InventoryService:
    def __init__(self, rules: ClusterSettings) -> None:
        self._rules = rules

    async def register(self, conn: AsyncConnection, registration: NodeRegistration) -> NodeView:
        """Create or refresh a node and its cards; it counts as a heartbeat."""
        await self._upsert_node(conn, registration)
        try:
            await self._upsert_cards(conn, registration)
        except IntegrityError as exc:
            raise Conflict(
                f"node {registration.name}: a card changed below what is allocated on it"
            ) from exc
        await self._retire_missing(conn, registration)
        await self._recount(conn, registration.name)
        return await self.view(conn, registration.name)

    async def heartbeat(self, conn: AsyncConnection, node: str, beat: Heartbeat) -> bool:
        """Record a heartbeat; True when it may have freed capacity (node back, card healthy)."""
        query = select(node_is_ready().label("ready")).where(nodes.c.name == node)
        timeout = {"node_timeout_s": self._rules.node_timeout_s}
        row = (await conn.execute(query.with_for_update(), timeout)).one_or_none()
        if row is None:
            raise NotFound(f"node {node} is not registered")
        await conn.execute(
            update(nodes).where(nodes.c.name == node).values(heartbeat_at=func.now())
        )
        healed = await conn.execute(
            update(gpus)
            .where(gpus.c.node_name == node, gpus.c.healthy == gpus.c.uuid.in_(beat.unhealthy))
            .values(healthy=gpus.c.uuid.not_in(beat.unhealthy))
            .returning(gpus.c.healthy)
        )
        return not row.ready or any(healed.scalars().all())

    async def view(self, conn: AsyncConnection, name: str) -> NodeView:
        return (await node_views(conn, self._rules.node_timeout_s, name))[0]

    async def _upsert_node(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        statement = insert(nodes).values(
            name=registration.name,
            labels=registration.labels,
            heartbeat_at=func.now(),
            segment=registration.segment,
            shm_dir=registration.shm_dir,
        )
        statement = statement.on_conflict_do_update(
            index_elements=[nodes.c.name],
            set_={
                "labels": statement.excluded.labels,
                "heartbeat_at": func.now(),
                "segment": statement.excluded.segment,
                "shm_dir": statement.excluded.shm_dir,
                "applied_generation": -1,  # a (re)started agent confirms nothing yet
            },
        )
        await conn.execute(statement)  # the upsert holds the node's row lock until commit

    async def _upsert_cards(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        fresh = insert(gpus)
        statement = fresh.on_conflict_do_update(
            index_elements=[gpus.c.uuid],
            set_={
                k: fresh.excluded[k] for k in ("idx", "model", "memory_mib", "max_vgpus", "healthy")
            },
            where=gpus.c.node_name == fresh.excluded.node_name,
        ).returning(gpus.c.uuid)
        rows = [self._card_row(registration.name, g) for g in registration.gpus]
        for row in rows:
            if (await conn.execute(statement, row)).scalar_one_or_none() is None:
                raise Conflict(f"card {row['uuid']} is registered on another node")

    def _card_row(self, node: str, gpu: GpuSpec) -> dict[str, Any]:
        return {
            "uuid": gpu.uuid,
            "node_name": node,
            "idx": gpu.index,
            "model": gpu.model,
            "memory_mib": gpu.memory,
            "max_vgpus": self._rules.max_vgpus(gpu.memory),
            "healthy": gpu.healthy,
        }

    async def _retire_missing(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        """Cards the node no longer reports: unhealthy (their vGPUs stay until released)."""
        listed = [g.uuid for g in registration.gpus]
        await conn.execute(
            update(gpus)
            .where(gpus.c.node_name == registration.name, gpus.c.uuid.not_in(listed))
            .values(healthy=False)
        )

    async def _recount(self, conn: AsyncConnection, name: str) -> None:
        free = select(func.coalesce(func.sum(gpus.c.memory_mib - gpus.c.allocated_mib), 0)).where(
            gpus.c.node_name == name
        )
        await conn.execute(
            update(nodes).where(nodes.c.name == name).values(free_mib=free.scalar_subquery())
        )
