"""Claim operations inside one transaction: create (place or leave Pending), retry pending,
and delete (release). They only execute statements; the caller commits."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from qshare.contracts import subjects
from qshare.contracts.claims import ClaimSpec, ClaimView, CreateClaim, CreateClaimReply, DeleteClaim
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import NotFound
from qshare.contracts.rows import claim_view, vgpus_of
from qshare.contracts.schema import claims
from qshare.settings import ClusterSettings
from sqlalchemy import Row, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare_allocator.claims.classes import ClassCatalog
from qshare_allocator.claims.views import demand_of, spec_of
from qshare_allocator.outbox import add_event
from qshare_allocator.placement.capacity import give_back, hold
from qshare_allocator.placement.demand import Demand, check_granularity
from qshare_allocator.placement.finder import Choice, find_and_lock

PendingCursor = tuple[datetime, uuid.UUID]
HOLDING = (ClaimStatus.PLACED.value, ClaimStatus.READY.value)


class ClaimService:
    def __init__(self, rules: ClusterSettings, source: str) -> None:
        self._rules = rules
        self._source = source
        self._classes = ClassCatalog()

    async def create(self, conn: AsyncConnection, command: CreateClaim) -> CreateClaimReply:
        """Place the claim now if anything fits, else record it Pending with the reason."""
        spec = command.spec
        demand = await self._demand(conn, spec)
        if spec.idempotency_key and (
            known := await self._by_key(conn, command.tenant, spec.idempotency_key)
        ):
            return CreateClaimReply(claim=known, created=False)
        claim_id = uuid.uuid4()
        choice = await find_and_lock(conn, demand, self._rules.node_timeout_s)
        row = await self._insert(conn, claim_id, command, demand, choice)
        held = await hold(conn, claim_id, demand, choice) if choice else []
        view = claim_view(row, held)
        await self._publish(conn, view)
        return CreateClaimReply(claim=view, created=True)

    async def place_pending(
        self, conn: AsyncConnection, after: PendingCursor | None
    ) -> PendingCursor | None:
        """Try the oldest pending claim after `after` that no replica holds; None: none left."""
        query = select(claims).where(claims.c.status == ClaimStatus.PENDING.value)
        if after is not None:
            query = query.where(tuple_(claims.c.created_at, claims.c.id) > tuple_(*after))
        query = (
            query.order_by(claims.c.created_at, claims.c.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        row = (await conn.execute(query)).one_or_none()
        if row is None:
            return None
        demand = await self._demand(conn, spec_of(row))
        if choice := await find_and_lock(conn, demand, self._rules.node_timeout_s):
            placed = await self._set_status(
                conn, row.id, ClaimStatus.PLACED, node=choice.node, reason=None
            )
            await self._publish(conn, claim_view(placed, await hold(conn, row.id, demand, choice)))
        return (row.created_at, row.id)

    async def delete(self, conn: AsyncConnection, command: DeleteClaim) -> ClaimView:
        """Release the claim's vGPUs; a claim of another tenant is reported as not found."""
        query = select(claims).where(claims.c.id == command.claim_id).with_for_update()
        row = (await conn.execute(query)).one_or_none()
        if row is None or (command.tenant is not None and row.tenant != command.tenant):
            raise NotFound(f"claim {command.claim_id} not found")
        if row.status == ClaimStatus.RELEASED.value:
            return claim_view(row, [])
        if row.status in HOLDING:
            await give_back(conn, row.id, row.node_name)
        released = await self._set_status(
            conn, row.id, ClaimStatus.RELEASED, node=row.node_name, reason=None
        )
        view = claim_view(released, [])
        await self._publish(conn, view)
        return view

    async def _demand(self, conn: AsyncConnection, spec: ClaimSpec) -> Demand:
        provisioner = await self._classes.provisioner(conn, spec.class_name)
        check_granularity(spec.vmemory, provisioner, self._rules)
        return demand_of(spec, provisioner, self._rules)

    async def _by_key(self, conn: AsyncConnection, tenant: str, key: str) -> ClaimView | None:
        query = select(claims).where(claims.c.tenant == tenant, claims.c.idempotency_key == key)
        row = (await conn.execute(query)).one_or_none()
        if row is None:
            return None
        return claim_view(row, (await vgpus_of(conn, [row.id])).get(row.id, []))

    async def _insert(
        self,
        conn: AsyncConnection,
        claim_id: uuid.UUID,
        command: CreateClaim,
        demand: Demand,
        choice: Choice | None,
    ) -> Row[Any]:
        spec = command.spec
        values = {
            "id": claim_id,
            "tenant": command.tenant,
            "status": (ClaimStatus.PLACED if choice else ClaimStatus.PENDING).value,
            "priority": spec.priority.value,
            "vcore": spec.vcore,
            "vmemory_mib": spec.vmemory,
            "count": spec.count,
            "class_name": spec.class_name,
            "node_selector": spec.node_selector,
            "placement": spec.placement.model_dump(mode="json") if spec.placement else None,
            "idempotency_key": spec.idempotency_key,
            "reason": None if choice else demand.describe(),
            "node_name": choice.node if choice else None,
        }
        row: Row[Any] = (await conn.execute(insert(claims).values(values).returning(claims))).one()
        return row

    async def _set_status(
        self,
        conn: AsyncConnection,
        claim_id: uuid.UUID,
        status: ClaimStatus,
        node: str | None,
        reason: str | None,
    ) -> Row[Any]:
        query = (
            update(claims)
            .where(claims.c.id == claim_id)
            .values(status=status.value, node_name=node, reason=reason, updated_at=func.now())
            .returning(claims)
        )
        row: Row[Any] = (await conn.execute(query)).one()
        return row

    async def _publish(self, conn: AsyncConnection, view: ClaimView) -> None:
        subject = subjects.claim_event(str(view.id), view.status.value)
        await add_event(conn, self._source, subject, f"io.qshare.claim.{view.status.value}", view)
