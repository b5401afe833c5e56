"""Connecting a service to NATS: reconnect forever with backoff, and report an outage in
one log line naming the URL instead of a traceback per attempt."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client

log = logging.getLogger(__name__)


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

    client = await nats.connect(
        url, name=name, user=user, password=password, max_reconnect_attempts=-1,
        reconnect_time_wait=0.5, disconnected_cb=disconnected, reconnected_cb=reconnected,
        error_cb=error,
    )  # fmt: skip
    made.append(client)
    return client
