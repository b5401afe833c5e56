"""Request/reply over NATS with typed errors, for both sides of a command subject.

A reply is an envelope; an error reply adds the headers `Nats-Service-Error` and
`Nats-Service-Error-Code` and carries an `ErrorBody`, which the caller raises again as
the matching `QshareError`. A reply that is neither (a bug, a version skew, a replier in
hostile hands) is raised as a `QshareError` too, so every caller handles it as a failed call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind
from pydantic import BaseModel, ValidationError

from qshare.contracts import envelope
from qshare.contracts.errors import (
    ERROR_CODE_HEADER,
    ERROR_HEADER,
    ErrorBody,
    QshareError,
    Unavailable,
)
from qshare.contracts.tracing import inject_headers
from qshare.outages import is_outage

R = TypeVar("R", bound=BaseModel)


async def call(
    nc: Client,
    subject: str,
    source: str,
    data: BaseModel,
    reply: type[R],
    timeout: float = 5.0,
    links: Sequence[SpanContext] = (),
) -> R:
    """Send a command and return its typed reply; raise the replier's error as a QshareError.
    Its CLIENT span is a child of the current one, linked to `links` (others it acts for).

    While NATS is not connected the command is refused (Unavailable), not buffered: nats.py
    would send a buffered request once it reconnects, so a command its caller was told had
    failed (a 503) would still run later (a claim created twice when the client retries).
    """
    if not nc.is_connected:
        raise Unavailable(f"NATS is not connected; {subject} not sent")
    body = envelope.encode(envelope.wrap(source, f"io.qshare.{subject}", data))
    linked = [Link(each) for each in links]
    with trace.get_tracer(__name__).start_as_current_span(
        subject, kind=SpanKind.CLIENT, links=linked
    ):
        msg = await _request(nc, subject, body, timeout)
    try:
        if msg.headers and ERROR_CODE_HEADER in msg.headers:
            error = QshareError.from_body(ErrorBody.model_validate_json(msg.data))
        else:
            return envelope.decode(msg.data).payload(reply)
    except ValidationError as exc:
        raise QshareError(f"malformed reply on {subject}: {_first(exc)}") from exc
    raise error


def _first(exc: ValidationError) -> str:
    """The first problem of a malformed reply, short enough for a log line or a header."""
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'body'}: {first['msg']}"[:200]


async def _request(nc: Client, subject: str, body: bytes, timeout: float) -> Msg:
    """The request, its headers carrying the current span; NATS failures as Unavailable."""
    try:
        return await nc.request(subject, body, timeout=timeout, headers=inject_headers())
    except (NoRespondersError, NatsTimeout) as exc:
        raise Unavailable(f"no answer on {subject}") from exc
    except NatsError as exc:
        if not is_outage(exc):
            raise
        raise Unavailable(f"NATS is not connected; {subject} not sent") from exc


async def reply_ok(nc: Client, msg: Msg, source: str, data: BaseModel | None) -> None:
    """Answer a request (a message without a reply subject is an event: nothing to answer)."""
    if msg.reply:
        await nc.publish(msg.reply, envelope.encode(envelope.wrap(source, "io.qshare.reply", data)))


async def reply_error(nc: Client, msg: Msg, error: QshareError) -> None:
    if msg.reply:
        headers = {ERROR_HEADER: error.detail[:200], ERROR_CODE_HEADER: str(error.code.status)}
        await nc.publish(msg.reply, error.body().model_dump_json().encode(), headers=headers)
