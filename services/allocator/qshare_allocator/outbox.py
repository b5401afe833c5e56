"""Transactional outbox: events are rows written with the change that caused them, and a relay
publishes them to JetStream only after that transaction has committed (a rollback leaves none).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from nats.errors import BadSubjectError, MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError
from pydantic import BaseModel
from sqlalchemy import Insert, bindparam, delete, insert, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope
from qshare.contracts.schema import outbox, outbox_dead
from qshare.contracts.tracing import inject_headers
from qshare_allocator import metrics
from qshare_allocator.db import in_transaction

log = logging.getLogger(__name__)
BATCH = 256
LINGER_S = 0.005
"""How long the relay waits after a wake-up so that a burst of commits shares one batch."""


def event_params(source: str, subject: str, type_: str, data: BaseModel) -> dict[str, Any]:
    """Parameters of `event_insert()`; `Nats-Msg-Id` lets JetStream drop a repeated publish."""
    event = envelope.wrap(source, type_, data)
    headers = inject_headers({"Nats-Msg-Id": event.id})
    return {"o_subject": subject, "o_body": envelope.encode(event), "o_headers": headers}


@functools.cache
def event_insert() -> Insert:
    """The outbox row of one event, written in the transaction of the change it reports."""
    return insert(outbox).values(
        subject=bindparam("o_subject"),
        body=bindparam("o_body"),
        headers=bindparam("o_headers", type_=JSONB),
    )


class OutboxRelay:
    """Publishes committed outbox rows; several replicas share the table via SKIP LOCKED."""

    def __init__(self, engine: AsyncEngine, js: JetStreamContext, scan_s: float) -> None:
        self._engine = engine
        self._js = js
        self._scan_s = scan_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Called after a commit that wrote events."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._scan_s)
            await asyncio.sleep(LINGER_S)  # let a burst of commits share one batch
            self._wake.clear()
            try:
                await self.drain()
            except Exception:
                log.exception("outbox relay failed; will retry")

    async def drain(self) -> int:
        """Publish until the outbox is empty; returns how many events left."""
        total = 0
        while sent := await in_transaction(self._engine, self._publish_batch):
            total += sent
        return total

    async def _publish_batch(self, conn: AsyncConnection) -> int:
        """Publish one batch; returns how many rows left the outbox (published or set aside).

        Each row stands alone: a row that can never be published (too large, refused) is
        moved to `outbox_dead` and logged; one that failed for now (NATS down) stays for the
        next scan. Neither holds back the rows after it.
        """
        query = (
            select(outbox.c.id, outbox.c.subject, outbox.c.body, outbox.c.headers,
                   outbox.c.created_at)
            .order_by(outbox.c.id)
            .limit(BATCH)
            .with_for_update(skip_locked=True)
        )  # fmt: skip
        rows = (await conn.execute(query)).all()
        if not rows:
            return 0
        outcomes = await asyncio.gather(
            *(self._publish(r.subject, r.body, r.headers) for r in rows), return_exceptions=True
        )
        dead = [(r, o) for r, o in zip(rows, outcomes, strict=True) if _permanent(o)]
        gone = [r.id for r, o in zip(rows, outcomes, strict=True) if o is None] + [
            r.id for r, _ in dead
        ]
        await self._set_aside(conn, dead)
        if gone:
            await conn.execute(delete(outbox).where(outbox.c.id.in_(gone)))
        if len(gone) < len(rows):
            log.warning("outbox: %d events not published yet; will retry", len(rows) - len(gone))
        return len(gone)

    async def _set_aside(self, conn: AsyncConnection, dead: list[tuple[Any, Any]]) -> None:
        for row, error in dead:
            log.error(
                "outbox: event %d on %s (%d bytes) cannot be published and is set aside in "
                "outbox_dead: %r", row.id, row.subject, len(row.body), error,
            )  # fmt: skip
            metrics.OUTBOX_DEAD.inc()
        if dead:
            await conn.execute(
                insert(outbox_dead),
                [
                    {"id": r.id, "subject": r.subject, "body": r.body, "headers": r.headers,
                     "error": repr(e)[:1000], "created_at": r.created_at}
                    for r, e in dead
                ],
            )  # fmt: skip

    async def _publish(self, subject: str, body: bytes, headers: dict[str, Any]) -> None:
        await self._js.publish(subject, body, headers={k: str(v) for k, v in headers.items()})


def _permanent(outcome: object) -> bool:
    """A publish error that retrying cannot cure."""
    return isinstance(outcome, MaxPayloadError | BadSubjectError | BadRequestError)
