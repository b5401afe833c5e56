"""Claims on a node that stopped heartbeating or on a card that turned unhealthy: each gets
an event (`degraded`) and a reason that says so; where its class allows, it is released
there and placed again elsewhere (`pending` until it fits). A degraded claim whose node and
cards are healthy again is whole again (event `recovered`)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import exists, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import claims, classes, gpus, nodes, vgpus
from qshare_allocator.claims.transitions import transition

DEGRADED = "degraded: "


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
            await transition(conn, self._source, row, ClaimStatus(row.status), None,
                             kind="recovered")  # fmt: skip
        return changed

    async def _degrade(self, conn: AsyncConnection, row: Any) -> None:
        why = f"node {row.node_name} is NotReady or a card of it is unhealthy"
        if row.replace_on_failure:
            await transition(conn, self._source, row, ClaimStatus.PENDING, f"re-placing: {why}",
                             release=True, node_name=None)  # fmt: skip
            return
        await transition(conn, self._source, row, ClaimStatus(row.status), DEGRADED + why,
                         kind="degraded")  # fmt: skip


def _sick_node_or_card() -> Any:
    sick_card = exists().where(
        vgpus.c.claim_id == claims.c.id,
        gpus.c.uuid == vgpus.c.gpu_uuid,
        not_(gpus.c.healthy),
    )
    return or_(not_(node_is_ready()), sick_card)


@functools.cache  # built once: every replica's scan runs it every second
def _newly_degraded() -> Any:
    return (
        select(claims.c.id, claims.c.status, claims.c.node_name, classes.c.replace_on_failure)
        .join(nodes, nodes.c.name == claims.c.node_name)
        .join(classes, classes.c.name == claims.c.class_name)
        .where(
            claims.c.status.in_(HOLDING_STATUSES),
            or_(claims.c.reason.is_(None), not_(claims.c.reason.startswith(DEGRADED))),
            _sick_node_or_card(),
        )
        .with_for_update(of=claims, skip_locked=True)
    )


@functools.cache
def _recovered() -> Any:
    return (
        select(claims.c.id, claims.c.status)
        .join(nodes, nodes.c.name == claims.c.node_name)
        .where(
            claims.c.status.in_(HOLDING_STATUSES),
            claims.c.reason.startswith(DEGRADED),
            not_(_sick_node_or_card()),
        )
        .with_for_update(of=claims, skip_locked=True)
    )
