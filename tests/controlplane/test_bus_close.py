"""`qshare.bus.close` bounds every step: stopping a service never hangs on NATS, even when
the server has stopped answering (the connection stays open, nothing replies)."""

from __future__ import annotations

import asyncio

import nats

from qshare import bus
from qshare.testing.servers import EmbeddedNats

BOUND_S = 0.5
"""Each step's bound; nats-py's own drain would wait 10 s for a flush that never returns."""


async def test_closing_a_connection_to_a_server_that_stopped_answering_returns_in_bounds() -> None:
    async with EmbeddedNats() as server:
        nc = await nats.connect(server.url, max_reconnect_attempts=0)
        await nc.subscribe("qshare.test.close")
        server.pause()
        try:
            async with asyncio.timeout(4 * BOUND_S + 2):
                await bus.close(nc, within_s=BOUND_S)
        finally:
            server.unpause()
