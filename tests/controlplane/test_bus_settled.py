"""`qshare.bus.settled`: once it returns True, the server has every subscription the connection
made before it, so a message published from any other connection reaches them. (One nats-py
`flush()` does not promise this: its PING can overtake a SUB still queued in the client.)"""

from __future__ import annotations

import nats
from nats.aio.client import Client

from qshare import bus
from qshare.bus import connect, options_for
from qshare.natsauth import NatsAuth, ServiceRole

CONNECTIONS = 150
"""Fresh connections, each subscribing once: a single flush lost about one in fifty here."""


async def test_a_fresh_connections_subscription_gets_the_next_message_once_settled(
    bus_url: str, nats_auth: NatsAuth, nc: Client
) -> None:
    operator = nats_auth.credentials(ServiceRole.OPERATOR)
    missed = 0
    for i in range(CONNECTIONS):
        watcher = await connect(options_for(bus_url, f"watcher-{i}", operator))
        try:
            sub = await watcher.subscribe("qshare.test.settled")
            assert await bus.settled(watcher)
            await nc.publish("qshare.test.settled", b"x")
            await bus.settled(nc)
            try:
                await sub.next_msg(timeout=2)
            except nats.errors.TimeoutError:
                missed += 1
        finally:
            await watcher.close()
    assert missed == 0


async def test_settling_a_closed_connection_says_so_instead_of_raising(
    bus_url: str, nats_auth: NatsAuth
) -> None:
    operator = nats_auth.credentials(ServiceRole.OPERATOR)
    watcher = await connect(options_for(bus_url, "closed", operator))
    await watcher.subscribe("qshare.test.settled")
    await watcher.close()
    assert await bus.settled(watcher) is False
