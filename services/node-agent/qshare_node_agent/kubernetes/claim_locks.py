"""One prepare or unprepare of a claim at a time. Pods sharing a ResourceClaim make the
kubelet call both for one claim from several calls at once (each pod's sandbox, retries);
each call must find what the one before it left, whole, and no call's failure may give back
what another was answered with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClaimLocks:
    """asyncio locks by claim uid, used from the DRA server's event loop; a uid has a lock
    only while a call holds it or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        self._outliving: set[asyncio.Future[Any]] = set()
        """Calls whose caller was cancelled, still running (a strong reference each)."""

    async def run_holding(self, uids: Iterable[str], work: Callable[[], Awaitable[T]]) -> T:
        """`work()` while holding every uid's lock, to its end: a cancelled caller (a kubelet
        call past its deadline) stops waiting for it, but the work goes on and keeps the
        claims until it is done, or the next call would find them half made and the work's
        failure could give back what that call was answered with."""
        held = list(uids)

        async def locked() -> T:
            async with self.holding(held):
                return await work()

        task = asyncio.ensure_future(locked())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._outliving.add(task)
            task.add_done_callback(self._outlived)
            raise

    def _outlived(self, task: asyncio.Future[Any]) -> None:
        self._outliving.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a call whose caller gave up failed: %r", task.exception())

    @contextlib.asynccontextmanager
    async def holding(self, uids: Iterable[str]) -> AsyncIterator[None]:
        """Hold every uid's lock, taken in sorted order (two calls naming the same claims
        in another order cannot wait for each other)."""
        async with contextlib.AsyncExitStack() as stack:
            for uid in sorted(set(uids)):
                await stack.enter_async_context(self._one(uid))
            yield

    def busy(self) -> set[str]:
        """The uids held or waited for now."""
        return set(self._locks)

    @contextlib.asynccontextmanager
    async def _one(self, uid: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(uid, asyncio.Lock())
        self._users[uid] = self._users.get(uid, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[uid] -= 1
            if not self._users[uid]:
                del self._users[uid], self._locks[uid]
