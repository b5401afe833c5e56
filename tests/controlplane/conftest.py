"""Fixtures for the control-plane tests: one real Postgres and one real NATS per session,
two allocator replicas and the API in-process, and an empty inventory for every test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare.bus import connect, options_for
from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, ClaimView, CreateClaim, CreateClaimReply
from qshare.contracts.nodes import NodeRegistration, NodeView
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.settings import ClusterSettings
from qshare.testing.inventory import empty_tables
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, nats_url, postgres_url
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings

ADMIN_TOKEN = "qs_test_admin_secret"
RULES = ClusterSettings(node_timeout_s=30, min_vgpu_mib=1024, gib_per_vgpu=4)


@pytest.fixture(scope="session")
async def database_url() -> AsyncIterator[str]:
    existing = postgres_url()
    if existing:
        await upgrade(existing)
        yield existing
        return
    async with EmbeddedPostgres(durable=False) as server:
        await upgrade(server.url)
        yield server.url


@pytest.fixture(scope="session")
def nats_auth() -> NatsAuth:
    """Every service's NATS identity, with fresh passwords; tests connect as `operator`."""
    return NatsAuth.generate()


@pytest.fixture(scope="session")
async def nats_server(nats_auth: NatsAuth) -> AsyncIterator[EmbeddedNats | None]:
    """The session's NATS, enforcing `nats_auth`; None when an existing server is used."""
    if nats_url():
        yield None
        return
    async with EmbeddedNats(config=nats_auth.server_config()) as server:
        yield server


@pytest.fixture(scope="session")
def bus_url(nats_server: EmbeddedNats | None) -> str:
    return nats_server.url if nats_server is not None else str(nats_url())


def as_identity(nats_auth: NatsAuth, role: ServiceRole) -> dict[str, Any]:
    """Settings fields that make a service connect as `role`."""
    found = nats_auth.credentials(role)
    return {"nats_user": found.user, "nats_password": found.password}


@pytest.fixture(scope="session")
async def replicas(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> AsyncIterator[list[Allocator]]:
    """Two allocator replicas sharing the queue group, as in production."""
    settings = [
        AllocatorSettings(
            database_url=database_url, nats_url=bus_url, instance=f"replica-{i}",
            pending_sweep_s=1.0, cluster=RULES, **as_identity(nats_auth, ServiceRole.ALLOCATOR),
        )
        for i in range(2)
    ]  # fmt: skip
    allocators = [Allocator(s) for s in settings]
    for allocator in allocators:
        await allocator.start()
    yield allocators
    for allocator in allocators:
        await allocator.stop()


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
async def nc(bus_url: str, nats_auth: NatsAuth) -> AsyncIterator[Client]:
    """A connection with every right (`operator`): tests play each role on it."""
    operator = nats_auth.credentials(ServiceRole.OPERATOR)
    client = await connect(options_for(bus_url, "tests", operator))
    yield client
    await client.drain()


@pytest.fixture(scope="session")
async def api(
    database_url: str, bus_url: str, replicas: list[Allocator], nats_auth: NatsAuth
) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token=ADMIN_TOKEN,
        max_body_bytes=4096, cluster=RULES, **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://qshare.test") as client:
            yield client


@pytest.fixture(autouse=True)
async def empty_inventory(engine: AsyncEngine) -> None:
    """Every test starts with no nodes and no claims (tokens and classes stay)."""

    await empty_tables(
        engine, ("nodes", "gpus", "claims", "vgpus", "outbox", "outbox_dead", "quotas")
    )


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="session")
async def tenant_tokens(api: httpx.AsyncClient) -> dict[str, str]:
    """Tokens of two tenants, issued by the admin."""
    issued = {}
    for tenant in ("team-a", "team-b"):
        body = {"name": f"{tenant} test", "tenant": tenant, "role": "tenant"}
        response = await api.post("/v1/tokens", json=body, headers=auth(ADMIN_TOKEN))
        issued[tenant] = response.json()["token"]
    return issued


def card(uuid_: str, index: int, memory: int | str = "16Gi") -> dict[str, Any]:
    return {"uuid": uuid_, "index": index, "model": "A100", "memory": memory}


Register = Callable[..., Awaitable[NodeView]]
Claim = Callable[..., Awaitable[ClaimView]]


@pytest.fixture
def register(nc: Client, replicas: list[Allocator]) -> Register:
    """Register a node with `cards` cards of `memory` each (UUIDs `<name>-g<i>`)."""

    async def go(name: str, cards: int = 1, memory: int | str = "16Gi", **labels: str) -> NodeView:
        gpus = [card(f"{name}-g{i}", i, memory) for i in range(cards)]
        registration = NodeRegistration.model_validate(
            {"name": name, "labels": labels, "gpus": gpus}
        )
        return await rpc.call(nc, subjects.NODES_REGISTER, "test", registration, NodeView)

    return go


@pytest.fixture
def claim(nc: Client, replicas: list[Allocator]) -> Claim:
    """Create a claim over NATS as tenant `team-a`; returns the stored claim."""

    async def go(tenant: str = "team-a", **spec: Any) -> ClaimView:
        fields = {"priority": "high", "vcore": 10, "vmemory": "1Gi"} | spec
        command = CreateClaim(tenant=tenant, spec=ClaimSpec.model_validate(fields))
        return (await rpc.call(nc, subjects.CLAIMS_CREATE, "test", command, CreateClaimReply)).claim

    return go


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
    """Wait until `check()` holds; the bound only stops a broken test, it asserts no timing."""
    async with asyncio.timeout(within_s):
        while not await check():
            await asyncio.sleep(0.05)


async def claim_status(engine: AsyncEngine, claim_id: uuid.UUID) -> str:
    async with engine.connect() as conn:
        query = text("SELECT status FROM claims WHERE id = :id")
        return str((await conn.execute(query, {"id": claim_id})).scalar_one())
