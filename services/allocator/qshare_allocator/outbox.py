"""Transactional outbox: events are rows written with the change that caused them, and a relay
publishes them to JetStream only after that transaction has committed (a rollback leaves none).

Replicas share the table through a session advisory lock per row: a relay takes the oldest
rows it can lock and skips those another relay holds, so two replicas share a backlog (before,
a relay that found the oldest batch held took nothing and waited its scan interval). Order: a
relay sends its batch in id order on one connection, and leaves a claim's events (its stream:
the subject but for its last token) to the relay holding an earlier one of that claim, so a
claim's events never go out from two relays out of order. A row whose publish fails for now
(NATS down) holds back nothing after it, as before: delivery is at least once, and in order
per claim except across such a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from datetime import datetime
from typing import Any, NamedTuple

from nats.errors import BadSubjectError, MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError
from pydantic import BaseModel
from sqlalchemy import (
    BigInteger,
    Delete,
    Insert,
    Select,
    TextClause,
    any_,
    bindparam,
    delete,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope
from qshare.contracts.schema import outbox, outbox_dead
from qshare.contracts.tracing import inject_headers
from qshare_allocator import metrics
from qshare_allocator.db import fetch, in_transaction

log = logging.getLogger(__name__)
BATCH = 256
LINGER_S = 0.005
"""How long the relay waits after a wake-up so that a burst of commits shares one batch."""
LOCK_CLASS = 0x0B0C
"""First key of the relay's advisory locks (two-key form: apart from the migration's lock);
the second is the row's id modulo 2^31 - 1."""


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
    """Publishes committed outbox rows; several replicas share the table via advisory locks."""

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
        """Publish until the outbox holds nothing this relay can take (another relay's rows
        are left to it); returns how many events left. A batch short of `BATCH` took every
        row it could (it pages through the outbox), so no empty batch is tried after it:
        rows committed meanwhile have woken the relay again."""
        total = 0
        while True:
            sent = await self._relay_batch()
            total += sent
            if sent < BATCH:
                return total

    async def _relay_batch(self) -> int:
        """Take a batch, publish it outside any transaction, then settle it in a short one;
        returns how many rows left the outbox (published or set aside).

        The batch is this relay's by session advisory locks on its rows' ids, held on a
        connection that is in no transaction while the publishes wait (no row locks, no
        `idle in transaction`); another replica's relay skips those rows. A crash loses
        the locks with the connection, and the rows are published again (at least once;
        `Nats-Msg-Id` lets JetStream drop the repeat)."""
        async with self._engine.connect() as conn:
            session = await conn.execution_options(isolation_level="AUTOCOMMIT")
            try:
                rows = await _take_batch(session)
            except BaseException:
                await _let_go(session)
                raise
            if rows is None:  # no lock taken, none to let go
                return 0
            try:
                return await self._publish_and_settle(session, rows) if rows else 0
            finally:
                await _let_go(session)

    async def _publish_and_settle(self, session: AsyncConnection, rows: list[_Row]) -> int:
        """Each row stands alone: a row that can never be published (too large, refused) is
        moved to `outbox_dead` and logged; one that failed for now (NATS down) stays for the
        next scan. Neither holds back the rows after it. Published rows alone are deleted by
        one statement on the batch's own connection (no transaction of their own)."""
        outcomes = await asyncio.gather(
            *(self._publish(r.subject, r.body, r.headers) for r in rows), return_exceptions=True
        )
        dead = [(r, o) for r, o in zip(rows, outcomes, strict=True) if _permanent(o)]
        gone = [r.id for r, o in zip(rows, outcomes, strict=True) if o is None] + [
            r.id for r, _ in dead
        ]
        if dead:
            await in_transaction(self._engine, functools.partial(self._settle, dead, gone))
        elif gone:
            await fetch(session, _delete(), {"ids": gone})
        if len(gone) < len(rows):
            log.warning("outbox: %d events not published yet; will retry", len(rows) - len(gone))
        return len(gone)

    async def _settle(self, dead: list[tuple[Any, Any]], gone: list[int],
                      conn: AsyncConnection) -> None:  # fmt: skip
        await self._set_aside(conn, dead)
        await conn.execute(_delete(), {"ids": gone})

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


async def _take_batch(session: AsyncConnection) -> list[_Row] | None:
    """Up to `BATCH` of the oldest rows whose advisory lock this session got, read after the
    locks (a row another relay published and deleted meanwhile is gone); None when it holds
    no lock. Rows another relay holds are skipped, and the rows after them are taken
    instead, page by page, but for those of a stream (see `_stream`) whose earlier row
    another relay holds. A short page was the outbox's end: no empty page is read after it
    (rows committed meanwhile wake the relay again)."""
    mine: list[int] = []
    held: set[str] = set()
    after = 0
    while len(mine) < BATCH:
        limits = {"after": after, "limit": BATCH - len(mine)}
        page = await fetch(session, _lock_page(), limits)
        if not page:
            break
        after = page[-1]["id"]
        mine += await _lock_in_order(session, page, held)
        if len(page) < limits["limit"]:  # the outbox's end: no page after it
            break
    return await _read(session, mine) if mine else None


async def _lock_in_order(session: AsyncConnection, page: list[Any], held: set[str]) -> list[int]:
    """The ids of `page` (`_lock_page` rows) this session locked, but for rows of a stream
    with an earlier row another relay holds (their locks are let go again). `held` gathers
    those streams, for the next pages."""
    kept: list[int] = []
    behind: list[int] = []
    for row in page:
        stream = _stream(row["subject"])
        if not row["got"]:
            held.add(stream)
        else:
            (behind if stream in held else kept).append(row["id"])
    if behind:
        await fetch(session, _unlocks(), {"ids": behind})
    return kept


def _stream(subject: str) -> str:
    """The events whose order is kept: a subject but for its last token, so one claim's
    (`qshare.evt.claim.<id>.<kind>`)."""
    return subject.rpartition(".")[0]


class _Row(NamedTuple):
    """An outbox row taken for publishing."""

    id: int
    subject: str
    body: bytes
    headers: dict[str, Any]
    created_at: datetime


async def _read(session: AsyncConnection, ids: list[int]) -> list[_Row]:
    rows = await fetch(session, _read_rows(), {"ids": ids})
    return [_Row(r["id"], r["subject"], r["body"], r["headers"], r["created_at"]) for r in rows]


@functools.cache
def _read_rows() -> Select[Any]:
    """The rows of `ids`, one statement text whatever their number (one prepared statement)."""
    return (
        select(outbox.c.id, outbox.c.subject, outbox.c.body, outbox.c.headers,
               outbox.c.created_at)
        .where(outbox.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))))
        .order_by(outbox.c.id)
    )  # fmt: skip


@functools.cache
def _delete() -> Delete:
    return delete(outbox).where(outbox.c.id == any_(bindparam("ids", type_=ARRAY(BigInteger))))


_ROW_KEY = f"{LOCK_CLASS}, (id % 2147483647)::int"
"""A row's advisory lock key: the one that taking its lock and letting it go must share."""
_EACH_ID = "FROM unnest(CAST(:ids AS bigint[])) AS id"


@functools.cache
def _lock_page() -> TextClause:
    """The next `limit` rows after `after`, each row's lock tried in the same statement:
    exactly once, and reported (the lock is taken in the select list over a page already
    cut by its LIMIT, never in a filter, which could take one for a row the query then
    drops, never to be let go)."""
    return text(
        f"SELECT id, subject, pg_try_advisory_lock({_ROW_KEY}) AS got FROM "
        "(SELECT id, subject FROM outbox WHERE id > :after ORDER BY id LIMIT :limit) AS page "
        "ORDER BY id"
    )


@functools.cache
def _unlocks() -> TextClause:
    return text(f"SELECT pg_advisory_unlock({_ROW_KEY}) {_EACH_ID}")


_UNLOCK_ALL = text("SELECT pg_advisory_unlock_all()")


async def _let_go(session: AsyncConnection) -> None:
    """Release the batch's locks; a connection that cannot is closed, which releases them
    (back in the pool it would keep those rows from every relay)."""
    try:
        await fetch(session, _UNLOCK_ALL, {})
    except Exception:
        await session.invalidate()
        raise
