"""Moving a stored claim to another status inside the caller's transaction: its row, its
event (`qshare.evt.claim.<id>.<kind>`) written to the outbox, and, when it leaves its cards,
its capacity given back. The one place the allocator's background work changes a claim."""

from __future__ import annotations

import uuid
from typing import Any

from opentelemetry.context import Context
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts import subjects
from qshare.contracts.claims import ClaimView
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import NotFound
from qshare.contracts.rows import claim_view, claim_views
from qshare.contracts.schema import claims
from qshare.contracts.tracing import attached, span_context, stored_context
from qshare_allocator.outbox import event_insert, event_params
from qshare_allocator.placement.capacity import give_back


async def locked_claim(conn: AsyncConnection, claim_id: uuid.UUID, tenant: str | None) -> Any:
    """The claim's row, locked; NotFound when there is none or, with `tenant` (None: an
    admin acts), when it is another tenant's."""
    query = select(claims).where(claims.c.id == claim_id).with_for_update()
    row = (await conn.execute(query)).one_or_none()
    if row is None or (tenant is not None and row.tenant != tenant):
        raise NotFound(f"claim {claim_id} not found")
    return row


async def transition(
    conn: AsyncConnection,
    source: str,
    row: Any,
    status: ClaimStatus,
    reason: str | None,
    *,
    release: bool = False,
    kind: str | None = None,
    **columns: Any,
) -> ClaimView:
    """Set `row`'s status and reason (and `columns`); `release` gives its vGPUs back first.
    The event's kind is the status unless `kind` names another (degraded, recovered)."""
    if release and row.node_name is not None:
        await give_back(conn, row.id, row.node_name)
    values = {"status": status.value, "reason": reason, "updated_at": func.now(), **columns}
    await conn.execute(update(claims).where(claims.c.id == row.id).values(**values))
    return await emit(conn, source, row.id, kind or status.value)


async def release(conn: AsyncConnection, source: str, row: Any, reason: str | None) -> ClaimView:
    """A `releasing` claim becomes `released` (its capacity went back on delete)."""
    return await transition(conn, source, row, ClaimStatus.RELEASED, reason,
                            release_generation=None)  # fmt: skip


async def emit(conn: AsyncConnection, source: str, claim_id: uuid.UUID, kind: str) -> ClaimView:
    """Write the claim's event of `kind`, carrying the claim as stored now."""
    fresh = (await conn.execute(select(claims).where(claims.c.id == claim_id))).one()
    view = (await claim_views(conn, [fresh]))[0]
    await conn.execute(event_insert(), claim_event_params(source, view, kind))
    return view


def claim_event_params(source: str, view: ClaimView, kind: str) -> dict[str, Any]:
    """The outbox row of the claim's event of `kind` (`qshare.evt.claim.<id>.<kind>`)."""
    subject = subjects.claim_event(str(view.id), kind)
    return event_params(source, subject, f"io.qshare.claim.{kind}", view)


async def ready_all(conn: AsyncConnection, source: str, views: list[ClaimView]) -> list[ClaimView]:
    """Claims (locked by the caller, seen as `views`) become ready with their events: two
    statements however many there are, on the path of every claim to `ready`."""
    if not views:
        return []
    held = {v.id: v.vgpus for v in views}
    query = (
        update(claims)
        .where(claims.c.id.in_(list(held)))
        .values(status=ClaimStatus.READY.value, reason=None, updated_at=func.now())
        .returning(*claims.c)
    )
    rows = (await conn.execute(query)).all()
    fresh = [claim_view(row, held[row.id]) for row in rows]
    events = []
    for row, view in zip(rows, fresh, strict=True):
        with attached(_own_trace(row)):
            events.append(claim_event_params(source, view, ClaimStatus.READY.value))
    await conn.execute(event_insert(), events)
    return fresh


def _own_trace(row: Any) -> Context | None:
    """The claim's own trace for its event when the current one is another's (an apply that
    several changes to its node shared runs in the first's trace); None: the current one."""
    own = stored_context(row.trace_context, f"claim {row.id}")
    current = span_context(None)
    mine = span_context(own)
    if mine is None or (current is not None and current.trace_id == mine.trace_id):
        return None
    return own
