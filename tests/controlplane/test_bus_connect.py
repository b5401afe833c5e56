"""`qshare.bus.connect` cancelled while NATS is unreachable (a service stopping before NATS
came up) takes its connect attempt down with it: no task of the client is left running and
nothing goes on trying to reach the server."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from qshare import bus
from qshare.testing.servers import EmbeddedNats, free_port

RECONNECT_WAIT_S = 0.1
TRYING_S = 0.5
"""How long the connect tries before it is cancelled: several attempts."""


async def _cancelled_while_trying(url: str) -> None:
    """Start `bus.connect` against `url`, where no server listens, then cancel it."""
    options = bus.BusOptions(url, "qshare-test-cancelled", reconnect_wait_s=RECONNECT_WAIT_S)
    connecting = asyncio.ensure_future(bus.connect(options))
    await asyncio.sleep(TRYING_S)
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await connecting


async def _connections(monitor_port: int) -> int:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{monitor_port}/connz")
    return int(answer.json()["num_connections"])


async def _tasks_left_after_a_cancelled_connect() -> set[asyncio.Task[object]]:
    async with EmbeddedNats() as server:
        await server.stop()
        before = asyncio.all_tasks()
        await _cancelled_while_trying(server.url)
        return asyncio.all_tasks() - before


def test_a_cancelled_connect_leaves_no_task_of_the_client_behind() -> None:
    """On an event loop of its own: the session's loop runs the tests' other services."""
    left = asyncio.run(_tasks_left_after_a_cancelled_connect())
    assert not left, [task.get_coro() for task in left]


async def test_a_cancelled_connect_stops_trying_to_reach_the_server() -> None:
    """The server comes back after the cancel: no connection from the cancelled client
    reaches it."""
    monitor = free_port()
    async with EmbeddedNats(config=f'http: "127.0.0.1:{monitor}"') as server:
        await server.stop()
        await _cancelled_while_trying(server.url)
        await server.start()
        await asyncio.sleep(10 * RECONNECT_WAIT_S)
        assert await _connections(monitor) == 0
