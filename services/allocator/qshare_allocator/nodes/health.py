"""Claims on a node that stopped heartbeating or on a card that turned unhealthy: each gets
an event (`degraded`) and a reason that says so; where its class allows, it is released
there and placed again elsewhere (`pending` until it fits). A degraded claim whose node and
cards are healthy again is whole again (event `recovered`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, func, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts import subjects
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.rows import claim_views, node_is_ready
from qshare.contracts.schema import claims, classes, gpus, nodes, vgpus
from qshare_allocator.outbox import event_insert, event_params
from qshare_allocator.placement.capacity import give_back

DEGRADED = "degraded: "
HOLDING = (ClaimStatus.PLACED.value, ClaimStatus.READY.value)


class HealthWatch:
    def __init__(self, source: str, node_timeout_s: float) -> None:
        self._source = source
        self._timeout = {"node_timeout_s": node_timeout_s}

    async def scan(self, conn: AsyncConnection) -> int:
        """One pass; returns how many claims changed (the caller commits, then sweeps)."""
        changed = 0
        for row in (await conn.execute(_newly_degraded(), self._timeout)).all():
            changed += 1
            await self._degrade(conn, row)
        for row in (await conn.execute(_recovered(), self._timeout)).all():
            changed += 1
            await self._mark(conn, row, ClaimStatus(row.status), None, "recovered")
        return changed

    async def _degrade(self, conn: AsyncConnection, row: Any) -> None:
        why = f"node {row.node_name} is NotReady or a card of it is unhealthy"
        if row.replace_on_failure:
            await give_back(conn, row.id, row.node_name)
            reason = f"re-placing: {why}"
            await self._mark(conn, row, ClaimStatus.PENDING, reason, "pending", node=None)
            return
        await self._mark(conn, row, ClaimStatus(row.status), DEGRADED + why, "degraded")

    async def _mark(
        self, conn: AsyncConnection, row: Any, status: ClaimStatus, reason: str | None,
        kind: str, node: str | None = "",
    ) -> None:  # fmt: skip
        values: dict[str, Any] = {
            "status": status.value,
            "reason": reason,
            "updated_at": func.now(),
        }
        if node is None:
            values["node_name"] = None
        await conn.execute(update(claims).where(claims.c.id == row.id).values(**values))
        fresh = (await conn.execute(select(claims).where(claims.c.id == row.id))).one()
        view = (await claim_views(conn, [fresh]))[0]
        subject = subjects.claim_event(str(row.id), kind)
        params = event_params(self._source, subject, f"io.qshare.claim.{kind}", view)
        await conn.execute(event_insert(), params)


def _sick_node_or_card() -> Any:
    sick_card = exists().where(
        vgpus.c.claim_id == claims.c.id,
        gpus.c.uuid == vgpus.c.gpu_uuid,
        not_(gpus.c.healthy),
    )
    return or_(not_(node_is_ready()), sick_card)


def _newly_degraded() -> Any:
    return (
        select(claims.c.id, claims.c.status, claims.c.node_name, classes.c.replace_on_failure)
        .join(nodes, nodes.c.name == claims.c.node_name)
        .join(classes, classes.c.name == claims.c.class_name)
        .where(
            claims.c.status.in_(HOLDING),
            or_(claims.c.reason.is_(None), not_(claims.c.reason.startswith(DEGRADED))),
            _sick_node_or_card(),
        )
        .with_for_update(of=claims, skip_locked=True)
    )


def _recovered() -> Any:
    return (
        select(claims.c.id, claims.c.status)
        .join(nodes, nodes.c.name == claims.c.node_name)
        .where(
            claims.c.status.in_(HOLDING),
            claims.c.reason.startswith(DEGRADED),
            not_(_sick_node_or_card()),
        )
        .with_for_update(of=claims, skip_locked=True)
    )
