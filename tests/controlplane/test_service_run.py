"""`Service.run`: stop() runs exactly once whichever way the service ends (started then
signalled, signalled while starting, a failed start), and a failed start's own error is the
one raised (so the process exits non-zero)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from qshare.service import Service


class Toy(Service):
    """A service whose start waits `start_s` then fails with `error` (if any)."""

    def __init__(self, start_s: float = 0.0, error: Exception | None = None) -> None:
        self.start_s, self.error, self.stops = start_s, error, 0
        self.stop_error: Exception | None = None

    async def start(self) -> None:
        await asyncio.sleep(self.start_s)
        if self.error is not None:
            raise self.error

    async def stop(self) -> None:
        self.stops += 1
        if self.stop_error is not None:
            raise self.stop_error


def signal_soon(after_s: float) -> None:
    asyncio.get_running_loop().call_later(after_s, os.kill, os.getpid(), signal.SIGTERM)


async def test_a_started_service_stops_once_on_sigterm() -> None:
    toy = Toy()
    signal_soon(0.2)
    await asyncio.wait_for(toy.run(), 5)
    assert toy.stops == 1


async def test_a_service_signalled_while_starting_stops_once() -> None:
    toy = Toy(start_s=3600)
    signal_soon(0.2)
    await asyncio.wait_for(toy.run(), 5)
    assert toy.stops == 1


async def test_a_failed_start_stops_once_and_raises_its_own_error() -> None:
    toy = Toy(error=ConnectionRefusedError("postgres is not there"))
    with pytest.raises(ConnectionRefusedError, match="postgres is not there"):
        await asyncio.wait_for(toy.run(), 5)
    assert toy.stops == 1


async def test_a_failed_start_whose_stop_fails_too_raises_the_starts_error() -> None:
    toy = Toy(error=ConnectionRefusedError("postgres is not there"))
    toy.stop_error = RuntimeError("stop broke")
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(toy.run(), 5)
    assert toy.stops == 1
