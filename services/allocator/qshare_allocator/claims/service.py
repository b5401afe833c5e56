"""Claim operations inside one transaction: create (place or leave Pending), retry pending,
and delete (release). They only execute statements; the caller commits.

Once the node is locked and its cards chosen, every write of a change (the claim, its
vGPUs, the card and node counters, its event) goes to Postgres as one statement.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from sqlalchemy import Insert, Row, Select, bindparam, func, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import UpdateBase

from qshare.contracts.claims import (
    ClaimSpec,
    ClaimView,
    CreateClaim,
    CreateClaimReply,
    DeleteClaim,
    VgpuView,
)
from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus, Priority, Provisioner
from qshare.contracts.errors import InvalidInput
from qshare.contracts.rows import claim_view, claim_views, node_is_ready
from qshare.contracts.schema import claims, nodes
from qshare.contracts.tracing import current_trace_context, later_span, stored_context
from qshare.settings import ClusterSettings
from qshare_allocator.claims.classes import ClassCatalog, deleted_class
from qshare_allocator.claims.idempotency import ensure_same_request
from qshare_allocator.claims.quotas import check_written, with_quota_lock
from qshare_allocator.claims.transitions import claim_event_params, locked_claim
from qshare_allocator.claims.views import demand_of, spec_of
from qshare_allocator.db import fetch, together
from qshare_allocator.outbox import event_insert
from qshare_allocator.placement import eviction, eviction_plan
from qshare_allocator.placement.capacity import give_back, holding
from qshare_allocator.placement.demand import Demand, check_granularity
from qshare_allocator.placement.diagnosis import why_not
from qshare_allocator.placement.finder import Choice, find_and_lock

PendingCursor = tuple[datetime, uuid.UUID]


class Placement(NamedTuple):
    """A stored claim placed: its node, and the trace its placement ran in (the creating
    request's), for the apply that sends it to the node once committed."""

    node: str
    trace: Context


class Finished(NamedTuple):
    """Evictions ended: how many victims were released, and the claims placed in the room."""

    released: int
    placed: list[Placement]


class PendingTry(NamedTuple):
    """One pending claim tried: where the next try starts, and whether it was placed."""

    cursor: PendingCursor
    placed: bool
    placement: Placement | None = None


PLACE_ATTEMPTS = 3  # a stale eviction plan starts placement over, at most this often


class ClaimService:
    def __init__(
        self,
        rules: ClusterSettings,
        source: str,
        placed_on: Callable[[Choice], None] = lambda choice: None,
    ) -> None:
        """`placed_on(choice)` hears of every node a claim is placed on, in the transaction
        (whether the node has an agent, read under its lock)."""
        self._rules = rules
        self._source = source
        self._classes = ClassCatalog()
        self._placed_on = placed_on

    async def create(self, conn: AsyncConnection, command: CreateClaim) -> CreateClaimReply:
        """Place the claim now if anything fits, else record it Pending with the reason."""
        spec = command.spec
        provisioner = await self._classes.provisioner(conn, spec.class_name)
        demand = self._demand_of(spec, provisioner)
        key = spec.idempotency_key
        if key and (known := await self._by_key(conn, command.tenant, key)):
            ensure_same_request(known, spec)
            return CreateClaimReply(claim=known, created=False)
        claim_id = uuid.uuid4()
        choice, reason = await self._place(conn, claim_id, demand)
        if choice is not None:
            self._placed_on(choice)
        held = holding(claim_id, demand, choice) if choice else None
        view = _new_view(claim_id, command, held.vgpus if held else [], reason)
        writes = with_quota_lock(_claim_insert(), *(held.statements if held else ()),
                                 event_insert())  # fmt: skip
        params = _claim_params(view, spec) | (held.params if held else {}) | self._event(view)
        params |= {"q_tenant": command.tenant, "k_class": spec.class_name}
        written = await self._write(conn, writes, params, spec.class_name)
        # a refusal rolls back the claim, its placement and its evictions, if any
        self._classes.confirm(spec.class_name, provisioner, written)
        await check_written(conn, command.tenant, written, demand, waits=choice is None)
        return CreateClaimReply(claim=view, created=True)

    async def _write(
        self, conn: AsyncConnection, writes: Select[Any], params: dict[str, Any], name: str
    ) -> Any:
        """Run a new claim's writes; a claim whose class was deleted meanwhile (its foreign
        key broken) is refused naming `class_name`."""
        try:
            return await fetch(conn, writes, params)
        except DBAPIError as error:
            if (refused := deleted_class(error, name)) is not None:
                raise refused from error
            raise

    async def place_pending(
        self, conn: AsyncConnection, after: PendingCursor | None, priority: Priority
    ) -> PendingTry | None:
        """Try the oldest pending claim of `priority` after `after` that no replica holds;
        None: none left."""
        query = select(claims).where(
            claims.c.status == ClaimStatus.PENDING.value, claims.c.priority == priority.value
        )
        if after is not None:
            query = query.where(tuple_(claims.c.created_at, claims.c.id) > tuple_(*after))
        query = query.order_by(claims.c.created_at, claims.c.id).limit(1)
        row = (await conn.execute(query.with_for_update(skip_locked=True))).one_or_none()
        if row is None:
            return None
        if (demand := await self._stored_demand(conn, row)) is None:
            return PendingTry((row.created_at, row.id), False)
        placed = await self._place_row(conn, row, demand, "pending sweep")
        if placed is None and eviction_plan.may_evict(demand):
            await self._evict_for_pending(conn, row.id, demand)
        return PendingTry((row.created_at, row.id), placed is not None, placed)

    async def _stored_demand(self, conn: AsyncConnection, row: Any) -> Demand | None:
        """A stored pending claim's demand; None, with a reason on the claim, when the rules
        of now refuse what was accepted under earlier ones (a larger minimum slice): it
        waits, and the sweep goes on to the claims after it."""
        try:
            return await self._demand(conn, spec_of(row))
        except InvalidInput as refused:
            reason = f"cannot be placed under the cluster's rules now: {refused.detail}"[:253]
            await conn.execute(
                update(claims)
                .where(claims.c.id == row.id, claims.c.reason.is_distinct_from(reason))
                .values(reason=reason, updated_at=func.now())
            )
            return None

    async def finish_evictions(self, conn: AsyncConnection) -> Finished:
        """End the evictions whose grace period is over, and place the claims they made room
        for at once, in the same transaction: a low-priority claim (a victim among them)
        placed before them would take the room, and they would evict again. Returns how many
        victims were released, and the claims placed."""
        released, waiting = await eviction.finish_due(conn, self._source)
        placed: list[Placement] = []
        if not waiting:
            return Finished(released, placed)
        query = select(claims).where(claims.c.id.in_(waiting))
        for row in (await conn.execute(query.order_by(claims.c.created_at, claims.c.id))).all():
            if (demand := await self._stored_demand(conn, row)) is None:
                continue
            if (done := await self._place_row(conn, row, demand, "end of eviction")) is not None:
                placed.append(done)
        return Finished(released, placed)

    async def _place_row(
        self, conn: AsyncConnection, row: Any, demand: Demand, by: str
    ) -> Placement | None:
        """Place a locked pending claim if it fits now, in a span continuing the trace of
        the request that created it (its `placed` event carries that trace); where it went
        and in which trace, or None when it did not fit (no span: a claim that waits long
        is tried at every sweep)."""
        started = time.time_ns()
        choice = await find_and_lock(conn, demand, self._rules.node_timeout_s)
        if choice is None:
            return None
        self._placed_on(choice)
        creator = stored_context(row.trace_context, f"claim {row.id}")
        attributes = {"qshare.claim.id": str(row.id), "qshare.node": choice.node,
                      "qshare.placed_by": by}  # fmt: skip
        with later_span("qshare.allocator", "claim.place", creator, start_time=started,
                        attributes=attributes) as span:  # fmt: skip
            await self._write_placement(conn, row, demand, choice)
            return Placement(choice.node, trace.set_span_in_context(span))

    async def _write_placement(
        self, conn: AsyncConnection, row: Any, demand: Demand, choice: Choice
    ) -> None:
        held = holding(row.id, demand, choice)
        view = claim_view(row, held.vgpus).model_copy(
            update={"status": ClaimStatus.PLACED, "node": choice.node, "reason": None}
        )
        params = _status_params(view) | held.params | self._event(view)
        await conn.execute(together(_status_update(), *held.statements, event_insert()), params)

    async def _evict_for_pending(
        self, conn: AsyncConnection, claim_id: uuid.UUID, demand: Demand
    ) -> None:
        """A waiting high-priority claim evicts as a new one would: capacity it waited for
        may since have gone to low priority. Not while claims are being evicted for it: their
        end places it (so one claim never evicts twice). Evictions for other claims do not
        hold it back."""
        if await eviction.under_way_for(conn, claim_id):
            return
        victims = await eviction_plan.plan(conn, demand, self._rules.node_timeout_s)
        if victims and await eviction.lock_victims(conn, victims):
            reason = await eviction.start(conn, victims, claim_id, self._source)
            await conn.execute(update(claims).where(claims.c.id == claim_id).values(reason=reason))

    async def delete(self, conn: AsyncConnection, command: DeleteClaim) -> ClaimView:
        """Give the claim's capacity back; it is `releasing` until its node confirms the
        vGPUs are gone (a Ready node with an agent), else `released` at once. A claim of
        another tenant is reported as not found."""
        row = await locked_claim(conn, command.claim_id, command.tenant)
        if row.status in (ClaimStatus.RELEASED.value, ClaimStatus.RELEASING.value):
            return claim_view(row, [])
        generation = None
        if row.status in HOLDING_STATUSES and await give_back(conn, row.id, row.node_name):
            generation = await self._awaiting(conn, row.node_name)
        status = ClaimStatus.RELEASED if generation is None else ClaimStatus.RELEASING
        view = claim_view(row, []).model_copy(update={"status": status})
        params = _status_params(view, generation) | self._event(view)
        await conn.execute(together(_status_update(), event_insert()), params)
        return view

    async def _awaiting(self, conn: AsyncConnection, node: str) -> int | None:
        """The generation that drops a released claim's vGPUs from `node`, when an agent on
        a Ready node will confirm it; None when nothing will."""
        query = select(nodes.c.desired_generation).where(
            nodes.c.name == node, nodes.c.segment.is_not(None), node_is_ready()
        )
        found = await conn.execute(query, {"node_timeout_s": self._rules.node_timeout_s})
        generation: int | None = found.scalar_one_or_none()
        return generation

    async def _place(
        self, conn: AsyncConnection, claim_id: uuid.UUID, demand: Demand
    ) -> tuple[Choice | None, str | None]:
        """The cards for a new claim, or why it waits: after evicting low-priority claims
        for a high-priority one when that makes room. A plan whose victims changed before
        they were locked (resized, released, moved), or are locked by another transaction
        now, is stale: placement starts over, and after a few tries the claim waits and the
        pending sweep evicts for it later."""
        timeout_s = self._rules.node_timeout_s
        for _ in range(PLACE_ATTEMPTS):
            if choice := await find_and_lock(conn, demand, timeout_s):
                return choice, None
            reason = await why_not(conn, demand, timeout_s)
            victims = await eviction_plan.plan(conn, demand, timeout_s)
            if not victims:
                return None, reason
            if await eviction.lock_victims(conn, victims):
                return None, await eviction.start(conn, victims, claim_id, self._source)
        return None, reason

    async def _demand(self, conn: AsyncConnection, spec: ClaimSpec) -> Demand:
        """A stored claim's demand (its class kept once read)."""
        return self._demand_of(spec, await self._classes.provisioner(conn, spec.class_name))

    def _demand_of(self, spec: ClaimSpec, provisioner: Provisioner) -> Demand:
        check_granularity(spec.vmemory, provisioner, self._rules)
        return demand_of(spec, provisioner, self._rules)

    async def _by_key(self, conn: AsyncConnection, tenant: str, key: str) -> ClaimView | None:
        query = select(claims).where(claims.c.tenant == tenant, claims.c.idempotency_key == key)
        row: Row[Any] | None = (await conn.execute(query)).one_or_none()
        if row is None:
            return None
        return (await claim_views(conn, [row]))[0]

    def _event(self, view: ClaimView) -> dict[str, Any]:
        return claim_event_params(self._source, view, view.status.value)


def _new_view(
    claim_id: uuid.UUID, command: CreateClaim, held: list[VgpuView], reason: str | None
) -> ClaimView:
    spec, now = command.spec, datetime.now(UTC)
    return ClaimView(
        id=claim_id,
        tenant=command.tenant,
        status=ClaimStatus.PLACED if held else ClaimStatus.PENDING,
        priority=spec.priority,
        vcore=spec.vcore,
        vmemory_mib=spec.vmemory,
        count=spec.count,
        class_name=spec.class_name,
        node_selector=spec.node_selector,
        placement=spec.placement,
        idempotency_key=spec.idempotency_key,
        reason=reason,
        node=held[0].node if held else None,
        vgpus=held,
        gang=spec.gang,
        created_at=now,
        updated_at=now,
    )


CLAIM_COLUMNS = (
    "id", "tenant", "status", "priority", "vcore", "vmemory_mib", "count", "class_name",
    "node_selector", "placement", "idempotency_key", "reason", "node_name", "created_at",
    "updated_at", "gang",
)  # fmt: skip


@functools.cache
def _claim_insert() -> Insert:
    columns = {c: bindparam(f"c_{c}", type_=claims.c[c].type) for c in CLAIM_COLUMNS}
    return insert(claims).values(
        columns | {"trace_context": bindparam("c_trace_context", type_=JSONB(none_as_null=True))}
    )


def _claim_params(view: ClaimView, spec: ClaimSpec) -> dict[str, Any]:
    """The new claim's row; with the creating request's trace context, for a later
    placement to continue."""
    row = view.model_dump(include=set(CLAIM_COLUMNS))
    placement = spec.placement.model_dump(mode="json") if spec.placement else None
    extra = {"status": view.status.value, "node_name": view.node, "placement": placement,
             "trace_context": current_trace_context()}  # fmt: skip
    return {f"c_{k}": v for k, v in (row | extra).items()}


@functools.cache
def _status_update() -> UpdateBase:
    return (
        update(claims)
        .where(claims.c.id == bindparam("s_id"))
        .values(status=bindparam("s_status"), node_name=bindparam("s_node"),
                reason=bindparam("s_reason"), release_generation=bindparam("s_release"),
                updated_at=func.now())
    )  # fmt: skip


def _status_params(view: ClaimView, release_generation: int | None = None) -> dict[str, Any]:
    return {
        "s_id": view.id,
        "s_status": view.status.value,
        "s_node": view.node,
        "s_reason": view.reason,
        "s_release": release_generation,
    }
