"""Stopping step by step: every step runs whatever an earlier one did (raised, or hung past
its bound and was left behind), and each failure is logged naming its step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence

from qshare.service import bounded

log = logging.getLogger(__name__)
STEP_S = 10.0
"""The longest one step of a stop may take before it is left behind."""


async def step(what: str, action: Callable[[], Awaitable[object]], within_s: float) -> bool:
    """Run `action()` for at most `within_s` (`service.bounded`: one still running then is
    left behind); True when it finished without error."""
    return await bounded(
        action(),
        within_s,
        lambda: log.error("stopping: %s did not finish within %g s; left behind", what, within_s),
        lambda error: log.error("stopping: %s failed (%r); going on", what, error),
    )


def each(steps: Sequence[tuple[str, Callable[[], object]]]) -> None:
    """Call every step of `steps` in turn (blocking), one that raises logged by its name."""
    for what, action in steps:
        try:
            action()
        except Exception as exc:
            log.error("stopping: %s failed (%r); going on", what, exc)


async def in_thread(action: Callable[[], object]) -> None:
    """`action()` in a daemon thread of its own: one that hangs holds neither the event
    loop's executor (which the loop waits for as it closes) nor the process's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            _answer(loop, done, exc)
        else:
            _answer(loop, done, None)

    threading.Thread(target=run, name="stop step", daemon=True).start()
    await done


def _answer(
    loop: asyncio.AbstractEventLoop, done: asyncio.Future[None], error: BaseException | None
) -> None:
    """Give the awaiting loop the thread's outcome (nothing once it gave up or closed)."""

    def settle() -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the loop has closed
        loop.call_soon_threadsafe(settle)
