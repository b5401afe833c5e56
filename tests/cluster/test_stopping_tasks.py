"""Stopping a service (node agent, allocator, preemptor) ends its background tasks through
`qshare.service.cancelled`, even when a cancellation is lost (Python 3.11's
`asyncio.wait_for` drops one that arrives together with the awaited reply, as a NATS
request's can), so `stop()` never waits for good on a retry loop."""

from __future__ import annotations

import asyncio

from qshare.service import cancelled


async def test_a_task_that_loses_one_cancellation_is_cancelled_again_until_it_ends() -> None:
    lost = 0

    async def retry_loop() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1  # as wait_for does when the reply and the cancellation meet

    task = asyncio.create_task(retry_loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancelled(task), 10)
    assert task.cancelled() and lost == 1


async def test_a_task_that_failed_before_stop_is_reported_not_raised() -> None:
    async def failed() -> None:
        raise ValueError("unreadable answer")

    task = asyncio.create_task(failed())
    await asyncio.sleep(0)
    await cancelled(task)
    assert isinstance(task.exception(), ValueError)
