"""Group commit on an event loop: handlers that changed state await `durable()`, and one
`flush`, run at the end of the loop's turn, saves the changes of every handler of that turn.
Concurrent requests are served in the same few turns, so they share one write and one
fsync instead of one each; each is answered only after the flush that covers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Batch:
    """The callers one flush answers, each with its outcome."""

    loop: asyncio.AbstractEventLoop
    durable: list[asyncio.Future[None]] = field(default_factory=list)


class GroupCommit:
    """Use from an event loop's thread. A flush that fails raises in every caller it covered.
    Each caller waits on a future of its own: one that is cancelled (a kubelet call that
    reached its deadline) leaves the flush, and the others waiting for it, alone."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
        self._pending: _Batch | None = None
        self.flushes = 0

    def durable(self) -> asyncio.Future[None]:
        """Done once a flush that began after this call has finished."""
        loop = asyncio.get_running_loop()
        batch = self._pending
        if batch is None or batch.loop is not loop:  # or left by a stopped loop
            batch = self._pending = _Batch(loop)
            loop.call_soon(self._run, batch)
        waiter: asyncio.Future[None] = loop.create_future()
        batch.durable.append(waiter)
        return waiter

    def _run(self, batch: _Batch) -> None:
        if self._pending is batch:
            self._pending = None
        self.flushes += 1
        try:
            self._flush()
        except Exception as exc:
            _answer(batch.durable, exc)
        else:
            _answer(batch.durable, None)


def _answer(waiters: list[asyncio.Future[None]], failure: Exception | None) -> None:
    for waiter in waiters:
        if waiter.done():  # its caller gave up
            continue
        if failure is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(failure)
