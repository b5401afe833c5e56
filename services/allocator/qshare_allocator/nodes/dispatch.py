"""Sends each node its desired state after every change. Changes coalesce only while an apply
has not read the desired state yet: one made after that read gets an apply of its own at once
(a newer generation) instead of waiting for the earlier round trip, up to MAX_IN_FLIGHT per
node; the node applies them in order and answers a late, older one as stale.

Every replica dispatches the nodes it changed at once, and all replicas scan for nodes whose
confirmed generation lags (an agent that was down, a lost reply), so nothing depends on one
process staying up. Applies are idempotent, so a node answering two replicas is harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from nats.aio.client import Client
from opentelemetry.trace import SpanContext
from sqlalchemy import func, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import QshareError
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import claims, nodes
from qshare.contracts.tracing import attached, span_context
from qshare.db import read_once
from qshare.service import cancelled
from qshare_allocator.claims.service import Finished
from qshare_allocator.claims.transitions import release
from qshare_allocator.db import in_transaction
from qshare_allocator.nodes.confirm import Confirmations
from qshare_allocator.nodes.desired import desired_state
from qshare_allocator.nodes.health import HealthWatch

log = logging.getLogger(__name__)
MAX_IN_FLIGHT = 3
"""Applies on their way to one node at once; a change beyond it waits for one to finish."""
MAX_LINKS = 32
"""The most traces of joined changes one apply's span links (a burst shares one apply)."""


class Dispatcher:
    """Carries desired states to node agents and their answers back into Postgres."""

    def __init__(
        self,
        nc: Client,
        engine: AsyncEngine,
        source: str,
        node_timeout_s: float,
        apply_timeout_s: float,
        on_commit: Callable[[], None],
        finish_evictions: Callable[[AsyncConnection], Awaitable[Finished]],
    ) -> None:
        self._nc = nc
        self._engine = engine
        self._source = source
        self._node_timeout_s = node_timeout_s
        self._apply_timeout_s = apply_timeout_s
        self._on_commit = on_commit
        self._finish_evictions = finish_evictions
        self.confirmations = Confirmations(source)
        self.health = HealthWatch(source, node_timeout_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, int] = {}
        self._unread: set[str] = set()
        self._again: set[str] = set()
        self._agentless: set[str] = set()
        self._joined: dict[str, list[SpanContext]] = {}
        """Per node, the traces of changes that joined an apply not started in their trace:
        the apply's span links them."""

    def wanted(self, node: str) -> None:
        """Send `node` its desired state soon: joins an apply that has not read it yet, else
        starts one (or, at MAX_IN_FLIGHT, has the next one to finish send again). Nodes known
        to have no agent (inventory made over REST: placement only) are skipped. The apply
        runs in the current trace; one joined links the joiner's."""
        if node in self._agentless:
            return
        if node in self._unread:
            self._join(node)
            return
        if self._in_flight.get(node, 0) >= MAX_IN_FLIGHT:
            self._again.add(node)
            self._join(node)
            return
        self._unread.add(node)
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        task = asyncio.create_task(self._send_one(node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _join(self, node: str) -> None:
        """Keep the current span for the link of the next apply that reads `node`'s state."""
        if (current := span_context(None)) is not None:
            joined = self._joined.setdefault(node, [])
            if current not in joined and len(joined) < MAX_LINKS:
                joined.append(current)

    def placed_on(self, node: str, agent: bool) -> None:
        """A claim was placed on `node`, which has an agent or not (as its row, locked, read):
        one without needs no read of its desired state to be known as such."""
        if agent:
            self._agentless.discard(node)
        else:
            self._agentless.add(node)

    async def stop(self) -> None:
        for task in list(self._tasks):
            await cancelled(task)

    def registered(self, node: str) -> None:
        """`node` registered (again), perhaps now with an agent: send it its desired state."""
        self._agentless.discard(node)
        self.wanted(node)

    async def _send_one(self, node: str) -> None:
        try:
            await self.send(node)
        except Exception:
            log.exception("apply to node %s failed; the scan retries it", node)
        finally:
            self._in_flight[node] -= 1
            if not self._in_flight[node]:
                del self._in_flight[node]
        if node in self._again:
            self._again.discard(node)
            self.wanted(node)

    async def send(self, node: str) -> ApplyReply | None:
        """One apply round trip; None when the node did not answer (it is retried later)."""
        joined: list[SpanContext] = []
        try:
            desired: ApplyDesired | None = await read_once(
                self._engine, lambda conn: self._read_desired(conn, node, joined)
            )
        except BaseException:
            self._unread.discard(node)  # no read happened: the next change must start one
            raise
        if desired is None:
            self._agentless.add(node)  # until it registers again, or a scan finds it has one
            return None
        subject = subjects.node_command(node, "apply")
        own = span_context(None)
        links = [each for each in joined if own is None or each.span_id != own.span_id]
        try:
            reply = await rpc.call(
                self._nc, subject, self._source, desired, ApplyReply, timeout=5.0, links=links
            )
        except QshareError as error:
            log.info("node %s did not apply generation %d: %s", node, desired.generation, error)
            return None
        if reply.node != node:  # it would decide the claims of the node it names
            log.warning("node %s answered apply generation %d as node %r; ignored",
                        node, desired.generation, reply.node)  # fmt: skip
            return None
        await in_transaction(self._engine, lambda conn: self.confirmations.confirm(conn, reply))
        self._on_commit()
        return reply

    async def _read_desired(
        self, conn: AsyncConnection, node: str, joined: list[SpanContext]
    ) -> ApplyDesired | None:
        """The desired state as of now; a change committed after this point is not in it,
        so it must start an apply of its own (wanted() no longer joins this one). `joined`
        gains the traces of the changes that joined this apply."""
        self._unread.discard(node)
        joined += self._joined.pop(node, [])
        return await desired_state(conn, node)

    async def scan(self) -> bool:
        """Dispatch every Ready node whose confirmation lags; fail claims no node confirmed
        and release those whose removal no node confirmed;
        degrade (or re-place) claims on sick nodes and cards. True when claims were freed
        for placement."""
        await self.dispatch_lagging()
        failed = await in_transaction(self._engine, self._fail_overdue)
        moved = await in_transaction(self._engine, self.health.scan)
        finished = await in_transaction(self._engine, self._finish_evictions)
        moved += finished.released
        for placement in finished.placed:  # sent at once, in the trace of the placement
            with attached(placement.trace):
                self.wanted(placement.node)
        if failed or moved or finished.placed:
            self._on_commit()
        return bool(moved)

    async def dispatch_lagging(self) -> None:
        """Send desired state to every Ready node whose confirmed generation lags and that
        has no apply on its way."""
        for node in await in_transaction(self._engine, self._lagging):
            self._agentless.discard(node)  # the scan reads only nodes with an agent
            if node not in self._in_flight:  # its answer is on the way
                self.wanted(node)

    async def _lagging(self, conn: AsyncConnection) -> list[str]:
        query = select(nodes.c.name).where(
            nodes.c.applied_generation < nodes.c.desired_generation,
            nodes.c.segment.is_not(None),
            node_is_ready(),
        )
        rows = await conn.execute(query, {"node_timeout_s": self._node_timeout_s})
        return list(rows.scalars().all())

    async def _fail_overdue(self, conn: AsyncConnection) -> int:
        return await self._fail_unplaced(conn) + await self._release_unconfirmed(conn)

    async def _release_unconfirmed(self, conn: AsyncConnection) -> int:
        """Release the `releasing` claims whose node did not confirm within the timeout or
        went NotReady (back, it gets a desired state without their vGPUs)."""
        overdue = func.now() - timedelta(seconds=self._apply_timeout_s)
        query = (
            select(claims, node_is_ready().label("node_ready"))
            .join(nodes, nodes.c.name == claims.c.node_name)
            .where(
                claims.c.status == ClaimStatus.RELEASING.value,
                or_(claims.c.updated_at < overdue, not_(node_is_ready())),
            )
            .with_for_update(of=claims, skip_locked=True)
        )
        rows = (await conn.execute(query, {"node_timeout_s": self._node_timeout_s})).all()
        for row in rows:
            await release(conn, self._source, row, self._unconfirmed(row))
        return len(rows)

    def _unconfirmed(self, row: Any) -> str:
        if not row.node_ready:
            return f"node {row.node_name} is NotReady; it removes the vGPUs when it is back"
        return (
            f"node {row.node_name} did not confirm the removal of the vGPUs within "
            f"{self._apply_timeout_s:g} s"
        )

    async def _fail_unplaced(self, conn: AsyncConnection) -> int:
        overdue = func.now() - timedelta(seconds=self._apply_timeout_s)
        query = (
            select(claims.c.id, claims.c.node_name)
            .join(nodes, nodes.c.name == claims.c.node_name)
            .where(
                claims.c.status == ClaimStatus.PLACED.value,
                claims.c.updated_at < overdue,
                nodes.c.segment.is_not(None),
            )
        )
        rows = (await conn.execute(query.with_for_update(skip_locked=True))).all()
        for row in rows:
            reason = (
                f"node {row.node_name} did not confirm the vGPUs within {self._apply_timeout_s:g} s"
            )
            await self.confirmations.fail(conn, row.id, row.node_name, reason)
        return len(rows)
