"""The life cycle every long-running qshare service shares: `start()` and `stop()`, used as
an async context manager, or `run()` until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
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
            await stop.wait()
