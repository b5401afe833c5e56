"""The life cycle every long-running qshare service shares: `start()` and `stop()`, used as
an async context manager, or `run()` until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Self

log = logging.getLogger(__name__)
CANCEL_AGAIN_S = 0.5


class Service:
    """Subclasses implement `start` and `stop`."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop. A signal that comes while the service is
        still starting (waiting for a NATS or Postgres server that is not up yet) ends the
        start where it waits, and what it had set up is stopped."""
        asked = _stop_on_signals()
        starting = asyncio.create_task(self.start(), name="start")
        stopping = asyncio.create_task(asked.wait(), name="stop signal")
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("asked to stop while starting")
            await cancelled(starting)
            await self.stop()
            return
        if starting.exception() is not None:
            stopping.cancel()
            await self._stop_after_failed_start()
            starting.result()  # raises the start's own error
        try:
            settle_heap()
            await stopping
        finally:
            await self.stop()

    async def _stop_after_failed_start(self) -> None:
        """Release what a failed start had set up; the start's error is the one reported."""
        try:
            await self.stop()
        except Exception:
            log.exception("stopping after a failed start failed too")


def _stop_on_signals() -> asyncio.Event:
    asked = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, asked.set)
    return asked


async def cancelled(task: asyncio.Task[None]) -> None:
    """Cancel `task` until it ends; an error it ended with is logged, not raised (a service
    stopping goes on stopping). Once is not always enough on Python 3.11: a cancellation
    that arrives together with a NATS request's reply is lost inside `asyncio.wait_for`, and
    a loop that retries every failure would then run on and its stop wait for good."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("task %s ended with %r", task.get_name(), error)


async def bounded(
    step: Awaitable[object],
    within_s: float,
    timed_out: Callable[[], None],
    failed: Callable[[object], None],
) -> bool:
    """Await `step` for at most `within_s`; True when it finished without error. One still
    running then is cancelled and not waited for: it may not end on a cancellation (nats-py's
    drain swallows one and goes on to flush and close, which can wait on a dead socket;
    `asyncio.wait_for` would then wait with it). `timed_out()` or `failed(error)` (the
    exception, or "cancelled") says which went wrong."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=within_s)
    if not done:
        task.cancel()
        task.add_done_callback(_outcome_ignored)
        timed_out()
        return False
    error = None if task.cancelled() else task.exception()
    if task.cancelled() or error is not None:
        failed(error or "cancelled")
        return False
    return True


def _outcome_ignored(task: asyncio.Future[object]) -> None:
    """An abandoned step's end is of no interest; reading it keeps asyncio from reporting an
    exception that was never retrieved."""
    if not task.cancelled():
        task.exception()


def settle_heap() -> None:
    """Move what start-up allocated (modules, schemas, caches) out of the collector's sight:
    a full collection then never walks it again, so it stops pausing the event loop for
    100 ms or more once the heap has grown."""
    gc.collect()
    gc.freeze()
