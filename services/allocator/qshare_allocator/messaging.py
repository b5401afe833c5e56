"""Routes NATS subjects to transactional handlers: decode and validate at the edge, run the
handler in one transaction, reply after commit, and turn every failure into an error reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope, rpc
from qshare.contracts.errors import (
    ErrorCode,
    FieldError,
    InvalidInput,
    QshareError,
    Unavailable,
)
from qshare.contracts.tracing import handling
from qshare.outages import is_outage
from qshare_allocator import metrics
from qshare_allocator.db import in_transaction
from qshare_allocator.groupcommit import GroupCommit

log = logging.getLogger(__name__)

Work = Callable[[AsyncConnection, Any, Msg], Awaitable[BaseModel | None]]


@dataclass(frozen=True)
class Grouping:
    """How grouped routes share transactions: at most `max_group` messages a transaction
    (1: none shared), at most `max_open` such transactions at once."""

    max_group: int = 1
    max_open: int = 1


@dataclass(frozen=True)
class Route:
    """`subject` (wildcards allowed) → `work(conn, payload, msg)`; then `after_commit`."""

    subject: str
    payload: type[BaseModel]
    work: Work
    after_commit: Callable[[BaseModel | None], None] | None = None
    grouped: bool = False
    """Concurrent messages share transactions (`GroupCommit`); each is answered after its
    commit as before."""


class Router:
    """Subscribes routes in a queue group and handles up to `max_in_flight` messages at once."""

    def __init__(
        self,
        nc: Client,
        engine: AsyncEngine,
        source: str,
        queue: str,
        max_in_flight: int,
        grouping: Grouping = Grouping(),
    ) -> None:
        self._nc = nc
        self._engine = engine
        self._source = source
        self._queue = queue
        self._slots = asyncio.Semaphore(max_in_flight)
        self._grouping = grouping
        self._groups: dict[str, GroupCommit] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.handled = 0

    async def subscribe(self, route: Route) -> None:
        if route.grouped and self._grouping.max_group > 1:
            self._groups[route.subject] = GroupCommit(
                self._engine, self._grouping.max_group, self._grouping.max_open, route.subject
            )

        async def dispatch(msg: Msg) -> None:
            await self._slots.acquire()
            task = asyncio.create_task(self._handle(route, msg))
            self._tasks.add(task)
            task.add_done_callback(self._done)

        await self._nc.subscribe(route.subject, queue=self._queue, cb=dispatch)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def drain(self) -> None:
        """Wait for the messages in hand."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, route: Route, msg: Msg) -> None:
        started = time.perf_counter()
        with handling("qshare.allocator", route.subject, msg.headers) as span:
            outcome = await self._outcome(route, msg)
            span.set_attribute("qshare.outcome", outcome)
        self.handled += 1
        metrics.HANDLED.labels(route.subject, outcome).inc()
        metrics.LATENCY.labels(route.subject).observe(time.perf_counter() - started)

    async def _outcome(self, route: Route, msg: Msg) -> str:
        try:
            payload = _decode(msg, route.payload)
        except InvalidInput as error:  # counted apart from requests refused for their content
            metrics.REJECTED.labels(route.subject).inc()
            await rpc.reply_error(self._nc, msg, error)
            return error.code.value
        try:
            result = await self._transaction(route, lambda conn: route.work(conn, payload, msg))
        except QshareError as error:
            await rpc.reply_error(self._nc, msg, error)
            return error.code.value
        except Exception as exc:
            failure = _unexpected(msg, exc)
            await rpc.reply_error(self._nc, msg, failure)
            return failure.code.value
        if route.after_commit is not None:
            route.after_commit(result)
        try:
            await rpc.reply_ok(self._nc, msg, self._source, result)
        except MaxPayloadError:
            log.error("reply on %s too large for NATS; answering an error instead", msg.subject)
            await rpc.reply_error(self._nc, msg, QshareError("reply too large; see allocator logs"))
            return ErrorCode.INTERNAL.value
        return "ok"

    async def _transaction(
        self, route: Route, work: Callable[[AsyncConnection], Awaitable[BaseModel | None]]
    ) -> BaseModel | None:
        group = self._groups.get(route.subject)
        if group is None:
            return await in_transaction(self._engine, work)
        result: BaseModel | None = await group.run(work)
        return result


def _unexpected(msg: Msg, exc: Exception) -> QshareError:
    """Postgres unreachable or restarting: 503, retry later. Anything else is a bug: 500."""
    if is_outage(exc):
        log.warning("handling %s: a backing service is unavailable: %r", msg.subject, exc)
        return Unavailable("Postgres is unavailable; retry later")
    log.exception("handling %s failed", msg.subject)
    return QshareError("internal error; see allocator logs")


def _decode(msg: Msg, model: type[BaseModel]) -> BaseModel:
    """The validated payload, or InvalidInput naming each bad field (`data.` paths)."""
    try:
        return envelope.decode(msg.data).payload(model)
    except ValidationError as exc:
        raise InvalidInput("malformed message", field_errors(exc)) from exc


def field_errors(exc: ValidationError) -> list[FieldError]:
    return [
        FieldError(field=".".join(str(p) for p in e["loc"]) or "body", message=e["msg"])
        for e in exc.errors()
    ]
