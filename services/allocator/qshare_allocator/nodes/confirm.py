"""What a node's answer to `cmd.apply` decides: its confirmed generation, claims whose every
vGPU it holds become `ready`, claims with a refused vGPU `failed` (capacity given back),
`releasing` claims whose vGPUs the confirmed generation dropped `released`, and how its
cards are shared."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.agent import LOCAL_ID_LIMIT, ApplyReply
from qshare.contracts.claims import ClaimView
from qshare.contracts.domain import HOLDING_STATUSES, ClaimStatus
from qshare.contracts.rows import claim_views
from qshare.contracts.schema import claims, nodes, vgpus
from qshare_allocator.claims.transitions import ready_all, release, transition
from qshare_allocator.inventory.sharing import record_apply

log = logging.getLogger(__name__)


class Confirmations:
    """Applies node answers inside the caller's transaction."""

    def __init__(self, source: str) -> None:
        self._source = source

    async def confirm(self, conn: AsyncConnection, reply: ApplyReply) -> list[ClaimView]:
        """Record the node's answer; returns the claims whose status changed. The claims'
        rows are locked first and the node's last, as a delete does, and so that the node's
        row (which every placement there also updates) is held only until the commit. An
        answer naming a generation never asked of the node, or one older than a generation
        it already confirmed, changes nothing."""
        if not await _asked(conn, reply):
            return []
        refused = _naming_vgpus(reply)
        changed = await self._fail_refused(conn, reply.node, refused)
        changed += await self._ready(conn, reply.node, set(reply.applied))
        changed += await self._released(conn, reply.node, reply.generation)
        await conn.execute(
            update(nodes)
            .where(nodes.c.name == reply.node)
            .values(applied_generation=func.greatest(nodes.c.applied_generation, reply.generation))
        )
        await record_apply(conn, reply)  # its cards after the node, as placement locks them
        return changed

    async def fail(
        self, conn: AsyncConnection, claim_id: uuid.UUID, node: str, reason: str
    ) -> ClaimView | None:
        """Fail one claim (lock taken here) and give its capacity back, if once locked it
        still holds capacity on `node`; None when it left meanwhile (deleted, moved, failed)."""
        query = select(claims).where(
            claims.c.id == claim_id,
            claims.c.node_name == node,
            claims.c.status.in_(HOLDING_STATUSES),
        )
        row = (await conn.execute(query.with_for_update())).one_or_none()
        if row is None:
            return None
        return await transition(conn, self._source, row, ClaimStatus.FAILED, reason, release=True)

    async def _released(self, conn: AsyncConnection, node: str, generation: int) -> list[ClaimView]:
        query = select(claims).where(
            claims.c.node_name == node,
            claims.c.status == ClaimStatus.RELEASING.value,
            claims.c.release_generation <= generation,
        )
        rows = (await conn.execute(query.with_for_update())).all()
        return [await release(conn, self._source, row, None) for row in rows]

    async def _fail_refused(
        self, conn: AsyncConnection, node: str, refused: dict[int, str]
    ) -> list[ClaimView]:
        if not refused:
            return []
        query = select(vgpus.c.claim_id, vgpus.c.local_id).where(
            vgpus.c.node_name == node, vgpus.c.local_id.in_(list(refused))
        )
        failed: dict[uuid.UUID, str] = {}
        for row in (await conn.execute(query)).all():
            failed.setdefault(row.claim_id, f"node {node} refused: {refused[row.local_id]}")
        views = [await self.fail(conn, claim, node, reason) for claim, reason in failed.items()]
        return [view for view in views if view is not None]

    async def _ready(self, conn: AsyncConnection, node: str, applied: set[int]) -> list[ClaimView]:
        placed = (
            await conn.execute(
                select(claims)
                .where(claims.c.node_name == node, claims.c.status == ClaimStatus.PLACED.value)
                .with_for_update()
            )
        ).all()
        if not placed:
            return []
        views = await claim_views(conn, list(placed))
        ready = [v for v in views if v.vgpus and all(g.local_id in applied for g in v.vgpus)]
        return await ready_all(conn, self._source, ready)


def _naming_vgpus(reply: ApplyReply) -> dict[int, str]:
    """The reply's refusals by local id, less those naming an id no vGPU can have (they
    would fail the whole confirmation in Postgres, on every retry)."""
    wild = {r.local_id for r in reply.refused if not 1 <= r.local_id < LOCAL_ID_LIMIT}
    if wild:
        log.warning("node %s refused local ids no vGPU can have: %s; ignored",
                    reply.node, sorted(wild))  # fmt: skip
    return {r.local_id: r.reason for r in reply.refused if r.local_id not in wild}


async def _asked(conn: AsyncConnection, reply: ApplyReply) -> bool:
    """Whether the answer is news: a generation the node was asked for (an agent answers an
    older apply with the newer generation it holds, never with one not asked yet), and not
    older than one already confirmed (its refusals would fail claims the newer one applied)."""
    query = select(nodes.c.applied_generation, nodes.c.desired_generation)
    found = (await conn.execute(query.where(nodes.c.name == reply.node))).one_or_none()
    if found is not None and found[0] <= reply.generation <= found[1]:
        return True
    log.warning("node %s answered apply generation %d (confirmed and desired: %s); ignored",
                reply.node, reply.generation, found)  # fmt: skip
    return False
