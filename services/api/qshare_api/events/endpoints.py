"""`GET /v1/events`: a server-sent event stream of qshare events for integrations that do
not speak NATS. A tenant receives its own claims' events; an admin every event. Each event's
`id:` is its sequence in the stream that keeps events (kept.py): a client reconnecting with
`Last-Event-ID` (browsers do) or `?after=` gets the events it missed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import StreamingResponse
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import AfterValidator
from sqlalchemy import select
from starlette.types import Receive, Scope, Send

from qshare import bus
from qshare.contracts.errors import InvalidInput
from qshare.contracts.schema import claims
from qshare_api.auth import Caller, Principal, still_valid
from qshare_api.events.kept import first_kept, follow, sequence
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/events", tags=["events"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]
KEEPALIVE_S = 15.0
QUEUE_LIMIT = 1000
OWNERS_LIMIT = 10_000
LAST_SEQUENCE = 2**63 - 1
"""The largest `after` taken: JetStream numbers events with unsigned 64-bit sequences."""


SUBJECT = re.compile(r"qshare\.evt(\.([A-Za-z0-9_-]+|\*))*(\.>)?")


def _event_subject(value: str) -> str:
    """A subject a client may follow, refused with an example rather than the pattern."""
    if not SUBJECT.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a subject under qshare.evt: dot-separated names, `*` for any "
            "one and a final `>` for the rest, e.g. qshare.evt.claim.*.ready or qshare.evt.gpu.>"
        )
    return value


@router.get(
    "",
    summary="Stream events (text/event-stream)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream(
    caller: Caller,
    res: Res,
    subject: Annotated[
        str,
        Query(
            max_length=200,
            description="a NATS subject under qshare.evt: tokens, `*` for one, a final `>`",
        ),
        AfterValidator(_event_subject),
    ] = "qshare.evt.>",
    after: Annotated[
        int | None,
        Query(ge=0, description="resume: the events after this one's `id:` (as Last-Event-ID)"),
    ] = None,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="what a reconnecting client sends")
    ] = None,
) -> StreamingResponse:
    """Each event is one SSE message: `id:` its sequence in the kept events, `event:` the
    NATS subject, `data:` the envelope. A token holds at most `max_event_streams_per_token`
    streams open at once (429 beyond)."""
    resume = _resume_after(after, last_event_id)
    backlog = Backlog()

    async def enqueue(msg: Msg) -> None:
        backlog.put(msg)

    res.streams.take(caller.token)
    try:
        sub = await follow(res.nc, subject, enqueue, resume)
        lost = await _lost_before(res, resume)
    except BaseException:
        res.streams.give_back(caller.token)
        raise
    try:
        await bus.settled(res.nc, within_s=2)  # once the stream opens, later events reach it
    except BaseException:
        await _end(sub, res, caller)
        raise
    tenant = caller.tenant_filter()
    owners = None if tenant is None else Owners(tenant, res)
    check = TokenCheck(res, caller.token)
    return EventStream(_messages(backlog, owners, lost, check), lambda: _end(sub, res, caller))


def _resume_after(after: int | None, last_event_id: str | None) -> int | None:
    """The sequence to resume after: `after`, else the Last-Event-ID header (an `id:` this
    API sent: digits), else None (from now on). Past LAST_SEQUENCE, NATS could not take the
    next one's number (it answered with an error read as 'events are not kept here')."""
    if after is not None and after > LAST_SEQUENCE:
        raise InvalidInput.on("after", f"{after} is past any event's sequence ({LAST_SEQUENCE})")
    if after is not None or last_event_id is None or not last_event_id.strip():
        return after
    if not re.fullmatch(r"[0-9]{1,19}", last_event_id.strip()):  # isdigit() takes '²'; int() not
        raise InvalidInput.on("Last-Event-ID", f"{last_event_id[:40]!r} is not an event id "
                              "this API sent (a sequence number)")  # fmt: skip
    return int(last_event_id)


async def _lost_before(res: Resources, resume: int | None) -> str:
    """The comment a resumed stream opens with when events it asked for are gone."""
    return "" if resume is None else lost_comment(await first_kept(res.nc), resume)


def lost_comment(first_kept: int, resume: int) -> str:
    """An SSE comment saying which events are gone, when the oldest kept one (0: unknown) is
    past the one after `resume`; else nothing."""
    if first_kept <= resume + 1:
        return ""
    return f": events before {first_kept} are no longer kept\n\n"


class EventStream(StreamingResponse):
    """The stream owns its subscription and its token's slot: `end` runs when the response
    ends, however that ends, also when the client leaves before the first byte (the body
    then never starts)."""

    def __init__(self, body: AsyncIterator[str], end: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type="text/event-stream")
        self.end = end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.end()


async def _end(sub: Subscription, res: Resources, caller: Principal) -> None:
    """What a stream gives back when it ends: its token's slot, then its subscription."""
    res.streams.give_back(caller.token)
    await _unsubscribe(sub)


async def _unsubscribe(sub: Subscription) -> None:
    """nats-py forgets the subscription before it tells the server, so even a cancelled call
    leaves no callback behind."""
    with contextlib.suppress(Exception):  # the connection may be closing already
        await sub.unsubscribe()


class Backlog:
    """The events a stream has yet to send, at most QUEUE_LIMIT: a slow reader costs no more
    memory. Past it, a live-only stream (no ids) drops events; one of kept events stops
    taking any and ends once it has sent what it holds, saying so, so that its client
    reconnects after the last `id:` it got and loses nothing (before, the events past the
    queue were dropped silently: a resume over 3000 missed events delivered 1000)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Msg] = asyncio.Queue(QUEUE_LIMIT)
        self.behind = False
        self.taken: int | None = None
        """The sequence of the last kept event taken out, sent or not (not the tenant's)."""

    async def get(self) -> Msg:
        msg = await self.queue.get()
        self.taken = sequence(msg) or self.taken
        return msg

    def put(self, msg: Msg) -> None:
        if self.behind:
            return
        try:
            self.queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.behind = sequence(msg) is not None

    def ended(self) -> bool:
        """Behind, and all it held was sent: the stream ends for the client to resume."""
        return self.behind and self.queue.empty()


BEHIND = ": this stream fell behind its events; reconnect with Last-Event-ID for the rest\n\n"


class TokenCheck:
    """Whether the stream's token still holds (neither revoked nor expired), asked of the
    database at most every `token_recheck_s`; a database that does not answer keeps the
    stream open (it is asked again next time)."""

    def __init__(self, res: Resources, digest: str) -> None:
        self.res = res
        self.digest = digest
        self.every_s = res.settings.token_recheck_s
        self.at = time.monotonic()

    async def holds(self) -> bool:
        now = time.monotonic()
        if now - self.at < self.every_s:
            return True
        self.at = now
        try:
            return await still_valid(self.res, self.digest)
        except Exception as error:
            log.warning("could not check an event stream's token (%r); checked again later", error)
            return True


ENDED = ": the token was revoked or has expired; the stream ends\n\n"


async def _messages(
    backlog: Backlog, owners: Owners | None, lost: str, check: TokenCheck
) -> AsyncIterator[str]:
    yield ": qshare events\n\n" + lost
    while True:
        if backlog.ended():  # an `id:` alone moves the client's Last-Event-ID past the events
            yield f"id: {backlog.taken}\n\n{BEHIND}"  # it was not shown: no reconnect loop
            return
        try:
            msg = await asyncio.wait_for(backlog.get(), min(KEEPALIVE_S, check.every_s))
        except TimeoutError:
            msg = None
        if not await check.holds():
            yield ENDED
            return
        if msg is None:
            yield ": keep-alive\n\n"
            continue
        visible = owners is None or await owners.sees(msg.subject)
        if visible and (data := _one_line(msg)) is not None:
            seq = sequence(msg)
            head = "" if seq is None else f"id: {seq}\n"
            yield f"{head}event: {msg.subject}\ndata: {data}\n\n"


def _one_line(msg: Msg) -> str | None:
    """The event's JSON on one line; None, logged, for a body that is not JSON (the stream
    goes on without it)."""
    try:
        return json.dumps(json.loads(msg.data))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        log.warning("event on %s is not JSON (%s); not streamed", msg.subject, error)
        return None


class Owners:
    """What one tenant's stream may show: the events of its own claims only. A claim's tenant
    never changes, so each claim costs one query per stream, not one per event."""

    def __init__(self, tenant: str, res: Resources) -> None:
        self.tenant = tenant
        self.res = res
        self.known: dict[uuid.UUID, str] = {}

    async def sees(self, subject: str) -> bool:
        claim_id = _claim_id(subject)
        return claim_id is not None and await self.owner(claim_id) == self.tenant

    async def owner(self, claim_id: uuid.UUID) -> str | None:
        """The claim's tenant; None, not remembered, when it is not found or not read."""
        if claim_id in self.known:
            return self.known[claim_id]
        found = await _read_owner(claim_id, self.res)
        if found is not None:
            if len(self.known) >= OWNERS_LIMIT:  # a stream open for months stays bounded
                del self.known[next(iter(self.known))]
            self.known[claim_id] = found
        return found


def _claim_id(subject: str) -> uuid.UUID | None:
    """The claim of `qshare.evt.claim.<id>.…`; None for any other subject."""
    parts = subject.split(".")
    if len(parts) < 4 or parts[2] != "claim":
        return None
    try:
        return uuid.UUID(parts[3])
    except ValueError:
        return None


async def _read_owner(claim_id: uuid.UUID, res: Resources) -> str | None:
    query = select(claims.c.tenant).where(claims.c.id == claim_id)
    try:
        async with res.reader.connect() as conn:
            owner: str | None = (await conn.execute(query)).scalar_one_or_none()
    except Exception:
        log.warning("could not read the owner of claim %s; its event is not streamed", claim_id)
        return None
    return owner
