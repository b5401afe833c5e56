"""`GET /v1/events` driven as the ASGI server would drive it: the stream's NATS subscription
and its token's slot live exactly as long as its response, a token holds a bounded number of
streams open, and a tenant's stream reads each claim's owner once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from sqlalchemy import event
from starlette.requests import ClientDisconnect

from qshare import bus
from qshare.contracts.domain import Role
from qshare.contracts.errors import RateLimited
from qshare.natsauth import NatsAuth, ServiceRole
from qshare_api.app import create_app
from qshare_api.auth import Principal
from qshare_api.events.endpoints import stream
from qshare_api.resources import Resources
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, Claim, Register, as_identity

ADMIN = Principal("admin", Role.ADMIN)
TEAM_A = Principal("team-a", Role.TENANT, token="team-a's token")
STREAMS_PER_TOKEN = 2
EVENT = json.dumps({"specversion": "1.0", "id": "x", "source": "test", "type": "t", "data": {}})


@pytest.fixture(scope="module")
async def res(database_url: str, bus_url: str, nats_auth: NatsAuth) -> AsyncIterator[Resources]:
    """An API of its own, so that its NATS connection holds only what these tests open."""
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token=ADMIN_TOKEN,
        cluster=RULES, max_event_streams_per_token=STREAMS_PER_TOKEN,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app.state.resources


def subscriptions(res: Resources) -> set[int]:
    """The ids of the subscriptions the API's NATS connection holds (nats-py keeps no public
    list of them), less the one nats-py opens at the connection's first request and keeps for
    every reply after (a stream's look at the kept events may be that first request)."""
    prefix = res.nc._resp_sub_prefix
    replies = None if prefix is None else prefix.decode() + "*"
    return {sid for sid, sub in res.nc._subs.items() if sub.subject != replies}


@contextlib.asynccontextmanager
async def streamed(res: Resources, caller: Principal) -> AsyncIterator[asyncio.Queue[str]]:
    """The body chunks of an open stream; the client disconnects on exit."""
    response = await stream(caller, res)
    chunks: asyncio.Queue[str] = asyncio.Queue()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.put_nowait(message["body"].decode())

    served = asyncio.create_task(response({"type": "http"}, receive, send))
    try:
        yield chunks
    finally:
        gone.set()
        await served


async def test_a_client_gone_before_the_first_byte_leaves_no_subscription(
    res: Resources,
) -> None:
    before = subscriptions(res)
    response = await stream(ADMIN, res)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client has left")  # what a server's send does then

    with pytest.raises(ClientDisconnect):
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert subscriptions(res) == before


async def test_a_failure_while_the_stream_starts_leaves_no_subscription(
    res: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fails(nc: Client, within_s: int = 5) -> bool:
        raise RuntimeError("settling failed")

    before = subscriptions(res)
    monkeypatch.setattr(bus, "settled", fails)
    with pytest.raises(RuntimeError):
        await stream(ADMIN, res)
    assert subscriptions(res) == before


async def test_a_tenant_stream_reads_a_claims_owner_once_and_hides_other_tenants_claims(
    res: Resources, nc: Client, register: Register, claim: Claim
) -> None:
    await register("n1", memory="80Gi")
    own, other = (await claim("team-a")).id, (await claim("team-b")).id
    queries: list[str] = []

    def count(conn: object, cursor: object, statement: str, *_: object) -> None:
        if "claims" in statement:
            queries.append(statement)

    event.listen(res.reader.sync_engine, "before_cursor_execute", count)
    try:
        async with streamed(res, TEAM_A) as chunks:
            for claim_id in (other, own) * 5:
                await nc.publish(f"qshare.evt.claim.{claim_id}.probe", EVENT.encode())
            seen = await _probes(chunks, str(own), 5)
    finally:
        event.remove(res.reader.sync_engine, "before_cursor_execute", count)
    assert not any(str(other) in chunk for chunk in seen)
    assert len(queries) <= 2, queries  # one for each claim, however many events


async def _probes(chunks: asyncio.Queue[str], claim_id: str, wanted: int) -> list[str]:
    """Every chunk read until `wanted` probe events of `claim_id` have come."""
    seen: list[str] = []
    async with asyncio.timeout(20):
        while sum(f"claim.{claim_id}.probe" in chunk for chunk in seen) < wanted:
            seen.append(await chunks.get())
    return seen


async def test_a_token_holding_its_most_streams_open_gets_a_429_for_one_more(
    res: Resources,
) -> None:
    async with streamed(res, TEAM_A), streamed(res, TEAM_A):
        with pytest.raises(RateLimited, match="already has 2 event streams open"):
            await stream(TEAM_A, res)


async def test_a_stream_that_ends_gives_its_tokens_slot_back(res: Resources) -> None:
    async with streamed(res, TEAM_A):
        async with streamed(res, TEAM_A):
            pass
        async with streamed(res, TEAM_A):
            assert res.streams.open(TEAM_A.token) == 2
    assert res.streams.open(TEAM_A.token) == 0


async def test_another_tokens_streams_do_not_count_against_a_token(res: Resources) -> None:
    other = Principal("team-a", Role.TENANT, token="another token of team-a")
    async with streamed(res, TEAM_A), streamed(res, TEAM_A), streamed(res, other):
        assert res.streams.open(other.token) == 1


async def test_a_stream_that_fails_to_start_gives_its_slot_back(
    res: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fails(nc: Client, within_s: int = 5) -> bool:
        raise RuntimeError("settling failed")

    monkeypatch.setattr(bus, "settled", fails)
    with pytest.raises(RuntimeError):
        await stream(TEAM_A, res)
    assert res.streams.open(TEAM_A.token) == 0


async def test_a_client_gone_before_the_first_byte_gives_its_slot_back(res: Resources) -> None:
    response = await stream(TEAM_A, res)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client has left")

    with pytest.raises(ClientDisconnect):
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert res.streams.open(TEAM_A.token) == 0
