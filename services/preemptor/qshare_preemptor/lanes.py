"""Work that must reach one place in the order it was decided (a node's suspends and resumes,
a claim's events), queued without waiting: each key's work runs after the work queued
before it under that key, while other keys' work goes on meanwhile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Lanes:
    def __init__(self) -> None:
        self._tails: dict[Hashable, asyncio.Task[object]] = {}

    def queue(self, key: Hashable, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Start `work()` once the work queued before under `key` has ended (however it
        ended); returns its task. Queueing never waits: the caller may hold a lock."""
        task = asyncio.create_task(_after(self._tails.get(key), work))
        self._tails[key] = task
        task.add_done_callback(lambda done: self._ended(key, done))
        return task

    def _ended(self, key: Hashable, task: asyncio.Task[T]) -> None:
        if self._tails.get(key) is task:
            del self._tails[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("queued work for %s failed", key, exc_info=task.exception())


async def _after(before: asyncio.Task[object] | None, work: Callable[[], Awaitable[T]]) -> T:
    if before is not None:
        await asyncio.wait([before])  # its outcome is for whoever queued it
    return await work()
