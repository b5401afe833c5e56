"""An open `GET /v1/events` stream checks its token every `token_recheck_s` and ends once
the token is revoked or has expired; a stream of a token that still holds goes on."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.domain import Role
from qshare.natsauth import NatsAuth, ServiceRole
from qshare_api.app import create_app
from qshare_api.auth import Principal, hash_token
from qshare_api.resources import Resources
from qshare_api.settings import ApiSettings
from qshare_api.tokens.repository import store_token
from tests.controlplane.conftest import RULES, as_identity
from tests.controlplane.test_event_stream import streamed

EVENT = json.dumps({"specversion": "1.0", "id": "x", "source": "t", "type": "t", "data": {}})


@pytest.fixture(scope="module")
async def res(database_url: str, bus_url: str, nats_auth: NatsAuth) -> AsyncIterator[Resources]:
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, cluster=RULES, token_recheck_s=0.2,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app.state.resources


async def _admin(engine: AsyncEngine) -> tuple[uuid.UUID, Principal]:
    secret = "qs_" + secrets.token_urlsafe(16)
    async with engine.begin() as conn:
        token_id, _ = await store_token(conn, "stream", "ops", Role.ADMIN, secret)
    return token_id, Principal("ops", Role.ADMIN, token=hash_token(secret))


async def _until_ended(chunks: asyncio.Queue[str], nc: Client) -> list[str]:
    """Chunks until the stream says it ends, publishing an event now and then."""
    seen: list[str] = []
    async with asyncio.timeout(10):
        while not any("the stream ends" in c for c in seen):
            await nc.publish("qshare.evt.gpu.probe", EVENT.encode())
            try:
                seen.append(await asyncio.wait_for(chunks.get(), 0.5))
            except TimeoutError:
                continue
    return seen


@pytest.mark.parametrize(
    "change",
    ["DELETE FROM tokens WHERE id = :id", "UPDATE tokens SET expires_at = now() WHERE id = :id"],
    ids=["revoked", "expired"],
)
async def test_a_stream_ends_once_its_token_is_revoked_or_expired(
    res: Resources, engine: AsyncEngine, nc: Client, change: str
) -> None:
    token_id, caller = await _admin(engine)
    async with streamed(res, caller) as chunks:
        await chunks.get()  # the stream is open
        async with engine.begin() as conn:
            await conn.execute(text(change), {"id": token_id})
        seen = await _until_ended(chunks, nc)
    assert "revoked or has expired" in seen[-1]
    assert res.streams.open(caller.token) == 0


async def test_a_stream_whose_token_holds_goes_on_past_its_checks(
    res: Resources, engine: AsyncEngine, nc: Client
) -> None:
    _, caller = await _admin(engine)
    async with streamed(res, caller) as chunks:
        await chunks.get()
        await asyncio.sleep(1.0)  # five checks
        await nc.publish("qshare.evt.gpu.probe", EVENT.encode())
        async with asyncio.timeout(10):
            while "qshare.evt.gpu.probe" not in (chunk := await chunks.get()):
                assert "the stream ends" not in chunk
