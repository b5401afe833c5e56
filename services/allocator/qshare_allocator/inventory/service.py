"""Node registration and heartbeats inside one transaction; the caller commits.

Registration and heartbeats lock the node row before touching its cards, the same order
placement uses, so they never race a placement on the same card. A removal (and a
registration that replaces a card) locks the claims it fails first, then the node, the
order of a delete, a resize and a move.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import DateTime, Interval, bindparam, case, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import Provisioner
from qshare.contracts.errors import Conflict, NotFound
from qshare.contracts.nodes import (
    MAX_GENERATION,
    ChangeNode,
    GpuSpec,
    Heartbeat,
    NodeRegistration,
    NodeView,
    RemovalReply,
)
from qshare.contracts.rows import node_is_ready, node_views
from qshare.contracts.schema import claims, classes, gpus, nodes, vgpus
from qshare.settings import ClusterSettings
from qshare_allocator.inventory.removal import (
    lock_claims_first,
    release_waiting_on,
    remove_cards,
)
from qshare_allocator.inventory.sharing import record_sharing


class InventoryService:
    def __init__(self, rules: ClusterSettings, source: str = "qshare-allocator") -> None:
        self._rules = rules
        self._source = source

    async def register(self, conn: AsyncConnection, registration: NodeRegistration) -> NodeView:
        """Create or refresh a node and its cards; it counts as a heartbeat. A new card at the
        index of one the node no longer reports replaces it (claims on the old one fail)."""
        replaced = await self._replaced(conn, registration)
        if replaced:  # their claims before the node, as every claim-then-node transaction
            await lock_claims_first(conn, registration.name, replaced)
        await self._upsert_node(conn, registration)
        await self._remove_replaced(conn, registration)
        try:
            await self._upsert_cards(conn, registration)
        except IntegrityError as exc:
            raise Conflict(
                f"node {registration.name}: a card changed below what is allocated on it"
            ) from exc
        await self._retire_missing(conn, registration)
        await self._recount(conn, registration.name)
        return await self.view(conn, registration.name)

    async def heartbeat(
        self, conn: AsyncConnection, node: str, beat: Heartbeat, sent: datetime
    ) -> bool:
        """Record a heartbeat sent at `sent` (the node's clock); True when it may have freed
        capacity (node back, card healthy). One sent before the last applied one (two
        replicas took both, and it committed last) keeps the node Ready but changes no card."""
        row = (await conn.execute(_beat_now(), self._beat_params(node, sent))).one_or_none()
        if row is None:
            raise NotFound(f"node {node} is not registered")
        if not row.in_order:
            return not row.ready
        healed = await conn.execute(
            update(gpus)
            .where(
                gpus.c.node_name == node,
                gpus.c.healthy == gpus.c.uuid.in_(beat.unhealthy),
                gpus.c.retired.is_(False),  # only a new registration brings a card back
            )
            .values(healthy=gpus.c.uuid.not_in(beat.unhealthy))
            .returning(gpus.c.healthy)
        )
        await record_sharing(conn, node, beat.sharing)
        return not row.ready or any(healed.scalars().all())

    def _beat_params(self, node: str, sent: datetime) -> dict[str, Any]:
        return {"node": node, "sent": _in_utc(sent), "node_timeout_s": self._rules.node_timeout_s,
                "clock_back": timedelta(seconds=self._rules.node_timeout_s)}  # fmt: skip

    async def remove_node(self, conn: AsyncConnection, name: str) -> RemovalReply:
        """Forget a node and its cards; claims on them fail with a reason and an event."""
        await lock_claims_first(conn, name)
        await self._lock(conn, name)
        cards = select(gpus.c.uuid).where(gpus.c.node_name == name)
        uuids = list((await conn.execute(cards)).scalars().all())
        failed = await remove_cards(conn, self._source, name, uuids)
        await release_waiting_on(conn, self._source, name)
        await conn.execute(delete(nodes).where(nodes.c.name == name))
        return RemovalReply(failed_claims=failed)

    async def change_node(self, conn: AsyncConnection, command: ChangeNode) -> NodeView:
        """Cordon (`schedulable` false) or open a node; its claims stay where they are, and a
        registration keeps what an operator set."""
        await self._lock(conn, command.name)
        await conn.execute(
            update(nodes)
            .where(nodes.c.name == command.name)
            .values(schedulable=command.change.schedulable)
        )
        return await self.view(conn, command.name)

    async def remove_card(self, conn: AsyncConnection, node: str, uuid: str) -> RemovalReply:
        """Forget one card of a node; claims holding a vGPU on it fail."""
        await lock_claims_first(conn, node, [uuid])
        await self._lock(conn, node)
        found = select(gpus.c.uuid).where(gpus.c.node_name == node, gpus.c.uuid == uuid)
        if (await conn.execute(found)).scalar_one_or_none() is None:
            raise NotFound(f"card {uuid} not found on node {node}")
        failed = await remove_cards(conn, self._source, node, [uuid])
        await self._recount(conn, node)
        return RemovalReply(failed_claims=failed)

    async def _lock(self, conn: AsyncConnection, name: str) -> None:
        query = select(nodes.c.name).where(nodes.c.name == name).with_for_update()
        if (await conn.execute(query)).scalar_one_or_none() is None:
            raise NotFound(f"node {name} is not registered")

    async def _replaced(self, conn: AsyncConnection, registration: NodeRegistration) -> list[str]:
        """Cards no longer reported whose index a newly reported card takes."""
        listed = [g.uuid for g in registration.gpus]
        query = select(gpus.c.uuid).where(
            gpus.c.node_name == registration.name,
            gpus.c.uuid.not_in(listed),
            gpus.c.idx.in_([g.index for g in registration.gpus]),
        )
        return list((await conn.execute(query)).scalars().all())

    async def _remove_replaced(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        replaced = await self._replaced(conn, registration)
        if replaced:
            await remove_cards(conn, self._source, registration.name, replaced)

    async def view(self, conn: AsyncConnection, name: str) -> NodeView:
        return (await node_views(conn, self._rules.node_timeout_s, name))[0]

    async def _upsert_node(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        statement = insert(nodes).values(
            name=registration.name,
            labels=registration.labels,
            heartbeat_at=func.now(),
            segment=registration.segment,
            shm_dir=registration.shm_dir,
            # a new row (first registration, or the node was deleted while its agent ran and
            # it registers again before any cmd.register): its generations count on past what
            # the agent applied of an older row, which it would answer as stale otherwise
            desired_generation=min(registration.applied_generation + 1, MAX_GENERATION),
        )
        statement = statement.on_conflict_do_update(
            index_elements=[nodes.c.name],
            set_={
                "labels": statement.excluded.labels,
                "heartbeat_at": func.now(),
                "segment": statement.excluded.segment,
                "shm_dir": statement.excluded.shm_dir,
                # a restarted agent confirms nothing yet (it says -1); a running one keeps
                # what was confirmed of it, never more than it says it applied
                "applied_generation": func.least(
                    nodes.c.applied_generation, registration.applied_generation
                ),
                "heartbeat_sent_at": None,  # nor is its clock compared with its predecessor's
            },
        )
        await conn.execute(statement)  # the upsert holds the node's row lock until commit

    async def _upsert_cards(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        fresh = insert(gpus)
        changed = ("idx", "model", "memory_mib", "max_vgpus", "healthy", "retired")
        statement = fresh.on_conflict_do_update(
            index_elements=[gpus.c.uuid],
            set_={k: fresh.excluded[k] for k in changed}
            | {"allocated_mib": _allocated_after(fresh.excluded.memory_mib)},
            where=gpus.c.node_name == fresh.excluded.node_name,
        ).returning(gpus.c.uuid)
        rows = [self._card_row(registration.name, g) for g in registration.gpus]
        for row in rows:
            if (await conn.execute(statement, row)).scalar_one_or_none() is None:
                raise Conflict(f"card {row['uuid']} is registered on another node")
        await conn.execute(_whole_slices_follow_their_card(), {"node": registration.name})

    def _card_row(self, node: str, gpu: GpuSpec) -> dict[str, Any]:
        return {
            "uuid": gpu.uuid,
            "node_name": node,
            "idx": gpu.index,
            "model": gpu.model,
            "memory_mib": gpu.memory,
            "max_vgpus": self._rules.max_vgpus(gpu.memory),
            "healthy": gpu.healthy,
            "retired": False,
        }

    async def _retire_missing(self, conn: AsyncConnection, registration: NodeRegistration) -> None:
        """Cards the node no longer reports: retired (their vGPUs stay until released), apart
        from `healthy`, which heartbeats set: no heartbeat brings a retired card back."""
        listed = [g.uuid for g in registration.gpus]
        await conn.execute(
            update(gpus)
            .where(gpus.c.node_name == registration.name, gpus.c.uuid.not_in(listed))
            .values(retired=True)
        )

    async def _recount(self, conn: AsyncConnection, name: str) -> None:
        free = select(func.coalesce(func.sum(gpus.c.memory_mib - gpus.c.allocated_mib), 0)).where(
            gpus.c.node_name == name
        )
        cores = {
            column: select(func.coalesce(func.sum(gpus.c[column]), 0))
            .where(gpus.c.node_name == name)
            .scalar_subquery()
            for column in ("core_high", "core_low")
        }
        await conn.execute(
            update(nodes)
            .where(nodes.c.name == name)
            .values(free_mib=free.scalar_subquery(), **cores)
        )


def _whole_held() -> Any:
    """UUIDs of cards held by a whole-card claim."""
    return (
        select(vgpus.c.gpu_uuid)
        .join(claims, claims.c.id == vgpus.c.claim_id)
        .join(classes, classes.c.name == claims.c.class_name)
        .where(classes.c.provisioner == Provisioner.WHOLE.value)
    )


def _allocated_after(memory_mib: Any) -> Any:
    """A card held whole stays allocated in full whatever memory it reports now, so no slice
    ever lands beside a whole-card claim; other cards keep what they have allocated."""
    return case((gpus.c.uuid.in_(_whole_held()), memory_mib), else_=gpus.c.allocated_mib)


def _whole_slices_follow_their_card() -> Any:
    """A whole-card vGPU's memory is its card's, so giving it back frees exactly the card."""
    return (
        update(vgpus)
        .where(
            vgpus.c.gpu_uuid == gpus.c.uuid,
            gpus.c.node_name == bindparam("node"),
            vgpus.c.gpu_uuid.in_(_whole_held()),
        )
        .values(vmemory_mib=gpus.c.memory_mib)
    )


def _in_utc(sent: datetime) -> datetime:
    """The node's time in UTC, where the database can hold it: one without a zone is taken as
    UTC, and one whose offset moves it past either end of the calendar (year 1 at +14:00)
    is the calendar's end there (before, the write failed: an internal error)."""
    if sent.tzinfo is None:
        return sent.replace(tzinfo=UTC)
    try:
        return sent.astimezone(UTC)
    except OverflowError:
        end = datetime.min if sent.year == datetime.min.year else datetime.max
        return end.replace(tzinfo=UTC)


@functools.cache
def _beat_now() -> Any:
    """The node's heartbeat time now; `ready`: as the last heartbeat left it; `in_order`: sent
    at or after the last applied one, or so long before it (more than the node timeout) that
    it is the node's clock set back, not a reordering (which would have made it NotReady)."""
    before = (
        select(
            nodes.c.name, nodes.c.heartbeat_sent_at.label("last"), node_is_ready().label("ready")
        )
        .where(nodes.c.name == bindparam("node"))
        .cte("before")
    )
    sent = bindparam("sent", type_=DateTime(timezone=True))
    in_order = or_(
        before.c.last.is_(None),
        sent >= before.c.last,
        sent < before.c.last - bindparam("clock_back", type_=Interval),
    )
    return (
        update(nodes)
        .where(nodes.c.name == before.c.name)
        .values(
            heartbeat_at=func.now(),
            heartbeat_sent_at=case((in_order, sent), else_=before.c.last),
        )
        .returning(before.c.ready, in_order.label("in_order"))
    )
