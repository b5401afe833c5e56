"""One prepare or unprepare of a claim at a time. Pods sharing a ResourceClaim make the
kubelet call both for one claim from several calls at once (each pod's sandbox, retries);
each call must find what the one before it left, whole, and no call's failure may give back
what another was answered with."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable


class ClaimLocks:
    """asyncio locks by claim uid, used from the DRA server's event loop; a uid has a lock
    only while a call holds it or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

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
