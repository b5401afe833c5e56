"""The JetStream stream for events; whoever publishes events first makes sure it exists."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StreamConfig
from nats.js.errors import BadRequestError

from qshare.contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS

EVENTS_MAX_AGE_S = 7 * 24 * 3600.0
DUPLICATE_WINDOW_S = 120.0


async def ensure_events_stream(js: JetStreamContext) -> None:
    """Create the events stream, or leave an existing one as it is."""
    config = StreamConfig(
        name=EVENTS_STREAM,
        subjects=list(EVENTS_SUBJECTS),
        retention=RetentionPolicy.LIMITS,
        max_age=EVENTS_MAX_AGE_S,
        duplicate_window=DUPLICATE_WINDOW_S,
    )
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.stream_info(EVENTS_STREAM)
