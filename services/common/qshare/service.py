"""The life cycle every long-running qshare service shares: `start()` and `stop()`, used as
an async context manager, or `run()` until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import signal
from typing import Self


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
        """Serve until SIGTERM or SIGINT, then stop."""
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        async with self:
            settle_heap()
            await stop.wait()


def settle_heap() -> None:
    """Move what start-up allocated (modules, schemas, caches) out of the collector's sight:
    a full collection then never walks it again, so it stops pausing the event loop for
    100 ms or more once the heap has grown."""
    gc.collect()
    gc.freeze()
