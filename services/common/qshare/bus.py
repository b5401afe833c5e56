"""Connecting a service to NATS: reconnect forever with backoff, and report an outage in
one log line naming the URL instead of a traceback per attempt."""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client
from nats.errors import NoServersError

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 10.0


async def connect(
    url: str, name: str, user: str | None = None, password: str | None = None
) -> Client:
    """A connection that survives NATS restarts of any length."""
    down = False
    made: list[Client] = []

    async def disconnected() -> None:
        nonlocal down
        if made and (made[0].is_closed or made[0].is_draining):
            return  # closing on purpose
        if not down:
            log.warning("%s: NATS %s unreachable; reconnecting with backoff", name, url)
        down = True

    async def reconnected() -> None:
        nonlocal down
        down = False
        log.info("%s: NATS %s reachable again", name, url)

    async def error(exc: Exception) -> None:
        if not down:
            log.warning("%s: NATS %s: %s", name, url, exc or type(exc).__name__)

    wait = 0.5
    while True:
        try:
            client = await nats.connect(
                url, name=name, user=user, password=password, max_reconnect_attempts=-1,
                reconnect_time_wait=0.5, disconnected_cb=disconnected, reconnected_cb=reconnected,
                error_cb=error, allow_reconnect=True, connect_timeout=2,
            )  # fmt: skip
            made.append(client)
            return client
        except (OSError, NoServersError, TimeoutError) as exc:
            log.warning("%s: NATS %s unreachable (%s); retrying in %.1f s", name, url,
                        type(exc).__name__, wait)  # fmt: skip
            await asyncio.sleep(wait)
            wait = min(wait * 2, MAX_BACKOFF_S)
