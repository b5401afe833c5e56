"""Audit (s38) of `GET /v1/events` resuming: a resumed stream's replay and its bounds."""

from __future__ import annotations

import httpx
from nats.aio.client import Client

from qshare_api.events.endpoints import QUEUE_LIMIT
from qshare_api.resources import Resources

from .conftest import ADMIN_TOKEN, auth
from .test_event_resume import kept, opened, until
from .test_event_stream import ADMIN, res

__all__ = ["res"]


async def test_a_resume_past_the_queue_gets_every_missed_event(res: Resources, nc: Client) -> None:
    subject = "qshare.evt.audit.replay"
    sequences = await kept(nc, subject, QUEUE_LIMIT * 3)
    async with opened(res, ADMIN, subject=subject, after=sequences[0] - 1) as seen:
        got = await until(seen, len(sequences))
    assert got == [f"{s} {subject}" for s in sequences]


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
