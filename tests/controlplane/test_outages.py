"""Outages of Postgres and NATS (issue 11, items 2 and 8): the API answers 503 with
`Retry-After` while a server is down, `/readyz` says which, and everything recovers by
itself once it is back, however long it was down. Each test owns its servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import nats
import pytest

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.errors import Unavailable
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, auth, eventually

RECONNECT_WAIT_S = 0.05
DEFAULT_BUDGET_ATTEMPTS = 60
"""nats.py gives up after this many reconnect attempts unless told otherwise."""


@dataclass
class Stack:
    postgres: EmbeddedPostgres
    bus: EmbeddedNats
    api: httpx.AsyncClient
    allocator: Allocator


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with EmbeddedPostgres(durable=False) as postgres, EmbeddedNats() as bus:
        await upgrade(postgres.url)
        common = {"database_url": postgres.url, "nats_url": bus.url, "cluster": RULES}
        allocator = Allocator(
            AllocatorSettings(**common, nats_reconnect_wait_s=RECONNECT_WAIT_S, instance="solo")
        )
        await allocator.start()
        settings = ApiSettings(
            **common, nats_reconnect_wait_s=RECONNECT_WAIT_S, bootstrap_admin_token=ADMIN_TOKEN,
            allocator_timeout_s=1.0,
        )  # fmt: skip
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                yield Stack(postgres, bus, client, allocator)
        await allocator.stop()


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert int(response.headers["retry-after"]) > 0


async def _ready(api: httpx.AsyncClient) -> bool:
    return (await api.get("/readyz")).status_code == 200


async def test_a_postgres_outage_answers_503_with_retry_after_then_recovers(stack: Stack) -> None:
    admin = auth(ADMIN_TOKEN)
    assert (await stack.api.get("/v1/claims", headers=admin)).status_code == 200
    await stack.postgres.stop()
    for _ in range(3):  # pooled connections that died, then new ones that cannot connect
        _assert_unavailable(await stack.api.get("/v1/claims", headers=admin))
    _assert_unavailable(await stack.api.get("/readyz"))
    await stack.postgres.start()
    await eventually(lambda: _ready(stack.api))
    assert (await stack.api.get("/v1/claims", headers=admin)).status_code == 200


async def test_a_create_during_a_postgres_outage_gets_an_unavailable_reply(stack: Stack) -> None:
    spec = ClaimSpec.model_validate({"priority": "high", "vcore": 10, "vmemory": "1Gi"})
    command = CreateClaim(tenant="team-a", spec=spec)
    nc = await nats.connect(stack.bus.url)
    try:
        await stack.postgres.stop()
        with pytest.raises(Unavailable):
            await rpc.call(nc, subjects.CLAIMS_CREATE, "test", command, CreateClaimReply)
    finally:
        await nc.close()


async def test_nats_down_longer_than_the_clients_default_budget_answers_503_then_recovers(
    stack: Stack,
) -> None:
    admin = auth(ADMIN_TOKEN)
    await stack.bus.stop()
    await asyncio.sleep(RECONNECT_WAIT_S * DEFAULT_BUDGET_ATTEMPTS * 1.5)
    _assert_unavailable(await stack.api.get("/readyz"))
    body = {"name": "n1", "gpus": [{"uuid": "g0", "index": 0, "model": "A", "memory": "16Gi"}]}
    _assert_unavailable(await stack.api.post("/v1/nodes", json=body, headers=admin))
    await stack.bus.start()
    await eventually(lambda: _ready(stack.api))
    response = await stack.api.post("/v1/nodes", json=body, headers=admin)
    assert response.status_code == 200, response.text


async def test_a_create_answered_503_while_nats_is_down_is_not_carried_out_once_it_is_back(
    stack: Stack,
) -> None:
    admin = auth(ADMIN_TOKEN)
    await stack.bus.stop()
    body = {"priority": "low", "vcore": 10, "vmemory": "1Gi"}
    _assert_unavailable(await stack.api.post("/v1/claims", json=body, headers=admin))
    await stack.bus.start()
    await eventually(lambda: _ready(stack.api))
    await stack.allocator.sweep_pending()  # a round trip through the allocator's loop
    assert (await stack.api.get("/v1/claims", headers=admin)).json()["items"] == []
