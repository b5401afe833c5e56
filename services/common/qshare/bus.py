"""Connecting a service to NATS: its own identity, TLS where configured, and reconnecting
forever (with backoff) so an outage of any length ends when NATS comes back."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from pydantic import BaseModel, Field, SecretStr

from qshare.natsauth import NatsCredentials, ServiceRole, inbox_prefix, nats_credentials
from qshare.service import bounded

log = logging.getLogger(__name__)
CLOSE_S = 5.0
"""The longest a client given up while connecting takes to close."""


@dataclass(frozen=True)
class BusOptions:
    """How one process connects; `user`/`password` name its identity (see `qshare.natsauth`)."""

    url: str
    name: str
    user: str | None = None
    password: SecretStr | None = None
    tls_ca: Path | None = None
    reconnect_wait_s: float = 2.0


def options_for(url: str, name: str, credentials: NatsCredentials | None) -> BusOptions:
    """Options of a connection as the identity `credentials` names (None: anonymous)."""
    if credentials is None:
        return BusOptions(url, name)
    return BusOptions(url, name, credentials.user, credentials.password)


Hook = Callable[[], Awaitable[None]]


async def connect(options: BusOptions, reconnected: Hook | None = None) -> Client:
    """A connection that never gives up reconnecting (nats.py's default stops after 60 tries,
    about two minutes, and then closes for good while the process stays up). A server that
    is not up yet is waited for; one that refuses the identity fails the call at once.
    `reconnected` runs after each reconnection, once the server has the connection's
    subscriptions again (what was published meanwhile did not reach them). Cancelled (a
    service stopping before NATS came up), it ends its attempt and closes the client before
    it returns: nothing goes on trying to reach the server."""
    refused = asyncio.Event()
    attempt = asyncio.ensure_future(_connect(options, refused, reconnected))
    waiter = asyncio.ensure_future(refused.wait())
    try:
        done, _ = await asyncio.wait({attempt, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await _abandon(attempt, waiter)
        raise
    if attempt in done:
        waiter.cancel()
        return attempt.result()
    await _abandon(attempt, waiter)
    raise PermissionError(_refusal(options))


async def _abandon(attempt: asyncio.Future[Client], waiter: asyncio.Future[Any]) -> None:
    """Cancel both and wait until they have ended; a connection the attempt made all the
    same (it ended as it was cancelled) is closed."""
    both: list[asyncio.Future[Any]] = [attempt, waiter]
    for task in both:
        task.cancel()
    await asyncio.wait(both)
    if not attempt.cancelled() and attempt.exception() is None:
        await _bounded(attempt.result().close(), CLOSE_S, "close")


def _refusal(options: BusOptions) -> str:
    if options.user is not None:
        return f"NATS refused the identity {options.user!r} of {options.name}"
    return (
        f"NATS refused {options.name}, which gave no identity: set the service's "
        "NATS_SECRETS_DIR (written by `python -m qshare.natsauth init DIR`) or its "
        "NATS_USER and NATS_PASSWORD"
    )


async def _connect(options: BusOptions, refused: asyncio.Event, reconnected: Hook | None) -> Client:
    nc = Client()
    try:
        await nc.connect(options.url, **_connect_options(options, refused, reconnected))
    except asyncio.CancelledError:  # the client may hold a socket: close it before going
        await _bounded(nc.close(), CLOSE_S, "close")
        raise
    return nc


def _connect_options(
    options: BusOptions, refused: asyncio.Event, reconnected: Hook | None
) -> dict[str, Any]:
    password = options.password.get_secret_value() if options.password else None
    return {
        "name": options.name,
        "user": options.user,
        "password": password,
        "tls": _tls(options.tls_ca),
        "inbox_prefix": inbox_prefix(options.user) if options.user else "_INBOX",
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": options.reconnect_wait_s,
        "error_cb": _error(options.name, refused),
        "disconnected_cb": _note(options.name, "disconnected from NATS"),
        "reconnected_cb": _note(options.name, "reconnected to NATS", reconnected),
    }


def _tls(ca: Path | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=str(ca)) if ca is not None else None


def _error(name: str, refused: asyncio.Event) -> Callable[[Exception], Awaitable[None]]:
    async def report(error: Exception) -> None:
        log.warning("%s: NATS error: %r", name, error)
        if "authorization violation" in str(error).lower():
            refused.set()

    return report


def _note(name: str, what: str, then: Hook | None = None) -> Hook:
    """Info (a close disconnects too; an outage shows as errors while reconnecting), then
    `then`, whose failure is logged: it must not break the client's reconnection."""

    async def report() -> None:
        log.info("%s: %s", name, what)
        if then is None:
            return
        try:
            await then()
        except Exception:
            log.exception("%s: what runs once %s failed", name, what)

    return report


async def settled(nc: Client, within_s: int = 5) -> bool:
    """Return once the server has applied everything this connection sent before the call,
    its subscriptions above all, so that a publish from any other connection reaches them.
    False, with a warning, when the server does not answer within `within_s` (the connection
    is down; the client sends its subscriptions again when it reconnects).

    One `flush()` does not promise that: nats-py writes the flush's PING straight to the
    socket, ahead of commands its flusher task still holds, so the PONG can come back before
    a SUB sent just before it reached the server (about one fresh connection in fifty here,
    whose first message was then lost). The first flush lets the flusher write what it
    holds; the second one's PING follows it."""
    try:
        await nc.flush(timeout=within_s)
        await nc.flush(timeout=within_s)
    except (nats.errors.Error, OSError) as error:
        log.warning("NATS did not confirm this connection's subscriptions: %r", error)
        return False
    return True


async def close(nc: Client, within_s: float = 5.0) -> None:
    """Drain what is in hand and close, each step bounded by `within_s`: a connection that
    cannot drain is closed, and one that cannot even close is left behind with a warning,
    so that stopping a service never hangs on NATS."""
    if nc.is_closed:
        return
    if not await _bounded(nc.drain(), within_s, "drain"):
        await _bounded(nc.close(), within_s, "close")


async def _bounded(step: Awaitable[None], within_s: float, what: str) -> bool:
    """Run `step` for at most `within_s` (`service.bounded`); True when it finished without
    error."""
    return await bounded(
        step,
        within_s,
        lambda: log.warning(
            "NATS %s did not finish within %.1f s; going on without it", what, within_s
        ),
        lambda error: log.warning("NATS %s failed (%r)", what, error),
    )


class BusIdentity(BaseModel):
    """The NATS fields of a service's settings: its URL, identity, TLS and reconnect wait.
    A service's settings class inherits them (with its own env prefix)."""

    nats_url: str = Field("nats://localhost:4222", description="the NATS server (JetStream on)")
    nats_user: str | None = Field(None, description="this service's NATS identity")
    nats_password: SecretStr | None = Field(
        None, description="this identity's password (or read from the NATS_SECRETS_DIR)"
    )
    nats_tls_ca: Path | None = Field(None, description="CA bundle; set it to connect over TLS")
    nats_secrets_dir: Path | None = Field(
        None, description="read this service's NATS password here (`python -m qshare.natsauth`)"
    )
    nats_reconnect_wait_s: float = Field(2.0, gt=0, le=60, description="between reconnects")

    def bus_as(self, name: str, role: ServiceRole, node: str | None = None) -> BusOptions:
        """How this service connects, as `name`, with the identity of `role` (and `node`)."""
        user, password = self.nats_user, self.nats_password
        if self.nats_secrets_dir is not None and password is None:
            found = nats_credentials(role, node, secrets_dir=self.nats_secrets_dir)
            user, password = found.user, found.password
        return BusOptions(
            self.nats_url, name, user, password, self.nats_tls_ca, self.nats_reconnect_wait_s
        )
