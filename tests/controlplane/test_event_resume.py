"""`GET /v1/events` resumes: every event carries its sequence in the kept events stream as its
SSE `id:`, and a client that reconnects with `Last-Event-ID` (what browsers send) or
`?after=` gets the events it missed, in order, then the live ones."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client

from qshare.contracts.errors import InvalidInput
from qshare.contracts.streams import ensure_events_stream
from qshare_api.auth import Principal
from qshare_api.events.endpoints import lost_comment, stream
from qshare_api.events.kept import first_kept
from qshare_api.resources import Resources

from .test_event_stream import ADMIN, EVENT, res, subscriptions

__all__ = ["res"]  # the module's own API (its fixture)
ID = re.compile(r"^id: (\d+)\nevent: (\S+)\n", re.MULTILINE)


@contextlib.asynccontextmanager
async def opened(res: Resources, caller: Principal, **resume: Any) -> AsyncIterator[list[str]]:
    """The events of an open stream as (id, subject) lines, read into a list as they come."""
    response = await stream(caller, res, **resume)
    seen: list[str] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            seen.extend(f"{i} {s}" for i, s in ID.findall(message["body"].decode()))

    served = asyncio.create_task(response({"type": "http"}, receive, send))
    try:
        yield seen
    finally:
        gone.set()
        await served


async def kept(nc: Client, subject: str, count: int) -> list[int]:
    """Publish `count` events on `subject` into the kept stream; their sequences."""
    js = nc.jetstream()
    await ensure_events_stream(js)
    return [(await js.publish(subject, EVENT.encode())).seq for _ in range(count)]


async def until(seen: list[str], wanted: int) -> list[str]:
    async with asyncio.timeout(20):
        while len(seen) < wanted:
            await asyncio.sleep(0.02)
    return seen


async def test_each_event_carries_its_sequence_as_its_id(res: Resources, nc: Client) -> None:
    await ensure_events_stream(nc.jetstream())
    async with opened(res, ADMIN, subject="qshare.evt.resume.live") as seen:
        (seq,) = await kept(nc, "qshare.evt.resume.live", 1)
        assert await until(seen, 1) == [f"{seq} qshare.evt.resume.live"]


async def test_reconnecting_with_last_event_id_gets_the_events_missed_in_order(
    res: Resources, nc: Client
) -> None:
    first, *missed = await kept(nc, "qshare.evt.resume.header", 3)
    resume = {"subject": "qshare.evt.resume.header", "last_event_id": str(first)}
    async with opened(res, ADMIN, **resume) as seen:
        assert await until(seen, 2) == [f"{s} qshare.evt.resume.header" for s in missed]


async def test_after_in_the_query_resumes_as_the_header_does(res: Resources, nc: Client) -> None:
    first, second = await kept(nc, "qshare.evt.resume.query", 2)
    async with opened(res, ADMIN, subject="qshare.evt.resume.query", after=first) as seen:
        assert await until(seen, 1) == [f"{second} qshare.evt.resume.query"]


async def test_a_resumed_stream_goes_on_with_live_events(res: Resources, nc: Client) -> None:
    (first,) = await kept(nc, "qshare.evt.resume.on", 1)
    async with opened(res, ADMIN, subject="qshare.evt.resume.on", after=first - 1) as seen:
        await until(seen, 1)
        (later,) = await kept(nc, "qshare.evt.resume.on", 1)
        assert await until(seen, 2) == [f"{s} qshare.evt.resume.on" for s in (first, later)]


async def test_a_last_event_id_that_is_no_sequence_is_refused_naming_it_and_holds_nothing(
    res: Resources,
) -> None:
    before = subscriptions(res)
    with pytest.raises(InvalidInput) as refused:
        await stream(ADMIN, res, last_event_id="abc")
    assert refused.value.errors[0].field == "Last-Event-ID"
    assert subscriptions(res) == before
    async with opened(res, ADMIN):  # the token's slot was not taken
        pass


async def test_the_oldest_kept_event_is_known(res: Resources, nc: Client) -> None:
    await kept(nc, "qshare.evt.resume.first", 1)
    assert await first_kept(res.nc) >= 1


def test_resuming_past_what_is_kept_says_which_events_are_gone() -> None:
    assert lost_comment(first_kept=50, resume=10) == ": events before 50 are no longer kept\n\n"


def test_resuming_within_what_is_kept_says_nothing_is_gone() -> None:
    assert lost_comment(first_kept=11, resume=10) == ""
    assert lost_comment(first_kept=0, resume=10) == ""
