"""Audit (s38) of `GET /v1/events` resuming: a resumed stream's replay and its bounds."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from nats.aio.client import Client

from qshare.contracts.streams import ensure_events_stream
from qshare_api.events.endpoints import QUEUE_LIMIT, stream
from qshare_api.resources import Resources

from .conftest import ADMIN_TOKEN, auth, eventually
from .test_event_resume import kept
from .test_event_stream import ADMIN, res

__all__ = ["res"]
ID = re.compile(r"^id: (\d+)$", re.MULTILINE)


async def _served(res: Resources, subject: str, after: int, got: list[int], want: int) -> None:
    """One stream after `after`, its ids added to `got`, until it ends or `got` holds `want` ids."""
    response = await stream(ADMIN, res, subject=subject, after=after)
    enough = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await enough.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            got.extend(int(i) for i in ID.findall(message["body"].decode()))
            if len(set(got)) >= want:
                enough.set()

    await asyncio.wait_for(response({"type": "http"}, receive, send), 30)


async def test_a_resume_past_the_queue_gets_every_missed_event_by_reconnecting(
    res: Resources, nc: Client
) -> None:
    """As a client reconnecting with its last id does (EventSource, `qshare events watch`)."""
    subject = "qshare.evt.audit.replay"
    sequences = await kept(nc, subject, QUEUE_LIMIT * 3)
    got: list[int] = []
    for _ in range(10):
        after = got[-1] if got else sequences[0] - 1
        await _served(res, subject, after, got, len(sequences))
        if len(set(got)) >= len(sequences):
            break
    assert list(dict.fromkeys(got)) == sequences  # the `id:` ending a stream repeats its last


async def test_a_stream_behind_past_events_it_does_not_show_moves_its_client_past_them(
    res: Resources, nc: Client
) -> None:
    """Events it does not show (a tenant's of other claims; here, bodies that are no JSON)
    fill its backlog all the same: the `id:` it ends with takes the reconnect past them."""
    subject = "qshare.evt.audit.hidden"
    js = nc.jetstream()
    await ensure_events_stream(js)
    first = (await js.publish(subject, b"not json")).seq
    for _ in range(QUEUE_LIMIT * 2):
        await js.publish(subject, b"not json")
    (shown,) = await kept(nc, subject, 1)
    got: list[int] = []
    for _ in range(6):
        await _served(res, subject, got[-1] if got else first - 1, got, len(set(got)) + 1)
        if shown in got:
            break
    assert got[-1] == shown, got


async def test_a_reader_that_stalls_holds_a_bounded_backlog(res: Resources, nc: Client) -> None:
    subject = "qshare.evt.audit.stall"
    sequences = await kept(nc, subject, QUEUE_LIMIT * 4)
    response = await stream(ADMIN, res, subject=subject, after=sequences[0] - 1)
    replays = [s for s in res.nc._subs.values() if s._jsi is not None]

    async def all_delivered() -> bool:  # the client reads nothing meanwhile
        return sum(s.delivered for s in replays) >= len(sequences)

    try:
        await eventually(all_delivered)
        pending = [s.pending_msgs for s in replays]
        assert pending and max(pending) < QUEUE_LIMIT, pending
    finally:
        await response.end()  # type: ignore[attr-defined]


async def test_a_last_event_id_of_other_digits_is_refused_naming_it(api: httpx.AsyncClient) -> None:
    """`²` is a digit to str.isdigit but no number to int(): it was a 500."""
    headers = {**auth(ADMIN_TOKEN), "Last-Event-ID": "\u00b2".encode("latin-1")}
    response = await api.get("/v1/events", headers=headers)  # type: ignore[dict-item]
    assert response.status_code == 422, response.text
    assert "Last-Event-ID" in response.text


async def test_an_after_past_any_sequence_is_a_422_not_a_503(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/events", params={"after": 2**64}, headers=auth(ADMIN_TOKEN))
    assert response.status_code == 422, response.text
    assert "after" in response.text
