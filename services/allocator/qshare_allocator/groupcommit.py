"""Group commit: concurrent calls of one handler share a transaction (one BEGIN and one COMMIT,
one WAL flush), and each caller still gets its own outcome only once that transaction commits.

A call whose work raises fails alone: the shared transaction rolls back, that caller gets its
error, and the others run again, each in a transaction of its own. A failure that running the
transaction again resolves (deadlock, serialization, a racing twin) retries the whole group.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare_allocator import metrics
from qshare_allocator.db import RETRYABLE_SQLSTATES, in_transaction, sqlstate

Work = Callable[[AsyncConnection], Awaitable[Any]]


@dataclass
class _Call:
    work: Work
    outcome: asyncio.Future[Any]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class _OneFailed(Exception):
    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


class GroupCommit:
    """Runs `work` in transactions shared by the calls waiting at that moment: up to
    `max_group` calls a transaction, at most `max_open` transactions at once; a call made while
    they are all open waits for the next one (so groups form as load grows)."""

    def __init__(self, engine: AsyncEngine, max_group: int, max_open: int, name: str) -> None:
        self._engine = engine
        self._max_group = max_group
        self._max_open = max_open
        self._name = name
        self._waiting: list[_Call] = []
        self._open = 0
        self._start_soon = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, work: Work) -> Any:
        """The result of `work`, once the transaction that ran it has committed."""
        call = _Call(work, asyncio.get_running_loop().create_future())
        self._waiting.append(call)
        if not self._start_soon:  # calls made in this turn of the loop join one group
            self._start_soon = True
            asyncio.get_running_loop().call_soon(self._start)
        return await call.outcome

    def _start(self) -> None:
        self._start_soon = False
        while self._waiting and self._open < self._max_open:
            group = self._waiting[: self._max_group]
            del self._waiting[: self._max_group]
            self._open += 1
            task = asyncio.create_task(self._run_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._open -= 1
        self._start()

    async def _run_group(self, group: list[_Call]) -> None:
        metrics.GROUP_SIZE.labels(self._name).observe(len(group))
        try:
            results = await in_transaction(self._engine, functools.partial(_all, group))
        except _OneFailed as failed:
            _settle(group[failed.index], error=failed.error)
            others = group[: failed.index] + group[failed.index + 1 :]
            await asyncio.gather(*(self._alone(call) for call in others))
            return
        except Exception as error:  # the whole transaction failed (Postgres down, retries spent)
            for call in group:
                _settle(call, error=error)
            return
        for call, result in zip(group, results, strict=True):
            _settle(call, result=result)

    async def _alone(self, call: _Call) -> None:
        try:
            result = await in_transaction(self._engine, functools.partial(_one, call))
        except Exception as error:
            _settle(call, error=error)
        else:
            _settle(call, result=result)


async def _one(call: _Call, conn: AsyncConnection) -> Any:
    """Run a call's work in its caller's context (its trace span, for the events it writes)."""

    async def work() -> Any:
        return await call.work(conn)

    return await asyncio.create_task(work(), context=call.context)


async def _all(group: list[_Call], conn: AsyncConnection) -> list[Any]:
    """Every call's work, in order, in one transaction; a failure names the call that failed,
    but for those that retrying the whole transaction resolves."""
    results = []
    for index, call in enumerate(group):
        try:
            results.append(await _one(call, conn))
        except DBAPIError as error:
            if sqlstate(error) in RETRYABLE_SQLSTATES:
                raise
            raise _OneFailed(index, error) from error
        except Exception as error:
            raise _OneFailed(index, error) from error
    return results


def _settle(call: _Call, result: Any = None, error: BaseException | None = None) -> None:
    """Hand a call its outcome, unless its caller has stopped waiting (cancelled)."""
    if call.outcome.done():
        return
    if error is not None:
        call.outcome.set_exception(error)
    else:
        call.outcome.set_result(result)
