"""Group commit on an event loop: handlers that changed state await `durable()`, and one
`flush`, run at the end of the loop's turn, saves the changes of every handler of that turn.
Concurrent requests are served in the same few turns, so they share one write and one
fsync instead of one each; each is answered only after the flush that covers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class GroupCommit:
    """Use from an event loop's thread. A flush that fails raises in every caller it covered."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
        self._pending: asyncio.Future[None] | None = None
        self.flushes = 0

    def durable(self) -> asyncio.Future[None]:
        """Done once a flush that began after this call has finished."""
        loop = asyncio.get_running_loop()
        pending = self._pending
        if pending is None or pending.get_loop() is not loop:  # or left by a stopped loop
            pending = self._pending = loop.create_future()
            loop.call_soon(self._run, pending)
        return pending

    def settled(self) -> asyncio.Future[None]:
        """Done once the flush now pending (if any) has finished, whatever its outcome."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        pending = self._pending
        if pending is None or pending.get_loop() is not loop:
            done.set_result(None)
        else:
            pending.add_done_callback(lambda _: _finish(done))
        return done

    def _run(self, batch: asyncio.Future[None]) -> None:
        if self._pending is batch:
            self._pending = None
        self.flushes += 1
        try:
            self._flush()
        except Exception as exc:
            batch.set_exception(exc)
            return
        batch.set_result(None)


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
