"""`GET /v1/events` driven as the ASGI server would drive it: the stream's NATS subscription
lives exactly as long as its response."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from starlette.requests import ClientDisconnect

from qshare import bus
from qshare.contracts.domain import Role
from qshare.natsauth import NatsAuth, ServiceRole
from qshare_api.app import create_app
from qshare_api.auth import Principal
from qshare_api.events.endpoints import stream
from qshare_api.resources import Resources
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, as_identity

ADMIN = Principal("admin", Role.ADMIN)


@pytest.fixture(scope="module")
async def res(database_url: str, bus_url: str, nats_auth: NatsAuth) -> AsyncIterator[Resources]:
    """An API of its own, so that its NATS connection holds only what these tests open."""
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token=ADMIN_TOKEN,
        cluster=RULES, **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app.state.resources


def subscriptions(res: Resources) -> set[int]:
    """The ids of the subscriptions the API's NATS connection holds (nats-py keeps no public
    list of them)."""
    return set(res.nc._subs)


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
