"""Where a stream of `GET /v1/events` reads: the JetStream stream that keeps every event
(7 days), through an ordered consumer of its own, so that each event carries its sequence as
its SSE `id:` and a client that reconnects with `Last-Event-ID` (or `?after=`) gets what it
missed. Where no such stream exists (a NATS without JetStream, or before any service made
it), a plain subscription: live events, no ids, no resuming."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from qshare.contracts.errors import Unavailable
from qshare.contracts.subjects import EVENTS_STREAM

log = logging.getLogger(__name__)
Callback = Callable[[Msg], Awaitable[None]]


async def follow(nc: Client, subject: str, cb: Callback, after: int | None) -> Subscription:
    """Events on `subject` from now on, or from the one after sequence `after`."""
    try:
        return await _from_stream(nc, subject, cb, after)
    except (NotFoundError, NatsError) as error:
        if after is not None:
            raise Unavailable(
                f"events are not kept here ({EVENTS_STREAM}: {error}), so a stream cannot "
                "resume after an event; reconnect without Last-Event-ID or after"
            ) from error
        log.info("event stream %s unavailable (%s): live events only, without ids",
                 EVENTS_STREAM, error)  # fmt: skip
        return await nc.subscribe(subject, cb=cb)


async def _from_stream(nc: Client, subject: str, cb: Callback, after: int | None) -> Subscription:
    js = nc.jetstream()
    await js.stream_info(EVENTS_STREAM)  # NotFoundError when no service made it
    if after is None:
        return await js.subscribe(subject, stream=EVENTS_STREAM, cb=cb, ordered_consumer=True,
                                  deliver_policy=DeliverPolicy.NEW)  # fmt: skip
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
    return await js.subscribe(
        subject, stream=EVENTS_STREAM, cb=cb, ordered_consumer=True, config=config
    )


async def first_kept(nc: Client) -> int:
    """The sequence of the oldest event still kept (0: none or unknown)."""
    try:
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
    except (NotFoundError, NatsError):
        return 0
    return int(info.state.first_seq or 0)


def sequence(msg: Msg) -> int | None:
    """The event's sequence in the stream; None for one a plain subscription delivered."""
    if not msg.reply or not msg.reply.startswith("$JS.ACK."):
        return None
    try:
        return int(msg.metadata.sequence.stream)
    except (ValueError, AttributeError, IndexError):
        return None
