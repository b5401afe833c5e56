"""Fixtures for the cluster-loop tests: real Postgres and NATS, an allocator, the API, the
preemptor and simulated node agents (the real agent over the real driver), all in-process;
an empty inventory for every test."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from alembic import command
from nats.aio.client import Client
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare.settings import ClusterSettings
from qshare.testing.inventory import empty_tables
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, free_port, nats_url, postgres_url
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import alembic_config, upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings
from qshare_preemptor.app import Preemptor
from qshare_preemptor.settings import PreemptorSettings

ADMIN_TOKEN = "qs_cluster_test_admin"
RULES = ClusterSettings(node_timeout_s=3, min_vgpu_mib=1024, gib_per_vgpu=4)
_names = itertools.count()
STARVATION_WINDOW_S = 1.0
"""Short, so the starvation tests take seconds; agents in them report usage every 0.2 s."""


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
async def bus_url() -> AsyncIterator[str]:
    existing = nats_url()
    if existing:
        yield existing
        return
    async with EmbeddedNats() as server:
        yield server.url


def allocator_settings(database_url: str, bus_url: str, instance: str) -> AllocatorSettings:
    return AllocatorSettings(
        database_url=database_url, nats_url=bus_url, instance=instance, pending_sweep_s=0.5,
        dispatch_scan_s=0.3, apply_timeout_s=10, cluster=RULES,
    )  # fmt: skip


@pytest.fixture(scope="session")
async def allocator(database_url: str, bus_url: str) -> AsyncIterator[Allocator]:
    async with Allocator(allocator_settings(database_url, bus_url, "cluster-a")) as running:
        yield running


@pytest.fixture(scope="session")
async def preemptor(database_url: str, bus_url: str) -> AsyncIterator[Preemptor]:
    settings = PreemptorSettings(
        database_url=database_url, nats_url=bus_url, instance="test",
        starvation_window_s=STARVATION_WINDOW_S, metrics_port=free_port(),
    )  # fmt: skip
    async with Preemptor(settings) as running:
        yield running


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
async def nc(bus_url: str) -> AsyncIterator[Client]:
    client = await nats.connect(bus_url)
    yield client
    await client.drain()


@pytest.fixture(scope="session")
async def api(
    database_url: str, bus_url: str, allocator: Allocator, preemptor: Preemptor
) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token=ADMIN_TOKEN,
        cluster=RULES,
    )  # fmt: skip
    async with admin_client(create_app(settings)) as client:
        yield client


@contextlib.asynccontextmanager
async def admin_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of `app` (started, and stopped on exit) with the admin token."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://qshare.test", headers=headers
        ) as client:
            yield client


@pytest.fixture(autouse=True)
async def empty_inventory(engine: AsyncEngine, allocator: Allocator) -> None:
    await empty_tables(
        engine, ("nodes", "gpus", "claims", "vgpus", "outbox", "preemptions", "starvations")
    )


StartAgent = Callable[..., Awaitable[NodeAgent]]


@pytest.fixture
async def start_agent(
    bus_url: str, allocator: Allocator, tmp_path: Path
) -> AsyncIterator[StartAgent]:
    """Start simulated node agents (real driver segments in `tmp_path`); stopped after the test."""
    started: list[NodeAgent] = []

    async def go(cards: int = 2, memory: str = "16Gi", **overrides: Any) -> NodeAgent:
        name = overrides.pop("name", f"node-{os.getpid()}-{next(_names)}")
        overrides.setdefault("keep_segment_on_stop", False)
        overrides.setdefault("release_delay_s", 0.02)
        overrides.setdefault("heartbeat_s", 0.5)
        settings = NodeAgentSettings(
            name=name, nats_url=bus_url, simulate=f"{cards}:{memory}", shm_dir=tmp_path,
            **overrides,
        )  # fmt: skip
        agent = NodeAgent(settings)
        await agent.start()
        started.append(agent)
        await asyncio.wait_for(agent.registered.wait(), 20)
        return agent

    yield go
    for agent in started:
        await agent.stop()


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
    """Wait until `check()` holds; the bound only stops a broken test, it asserts no timing."""
    async with asyncio.timeout(within_s):
        while not await check():
            await asyncio.sleep(0.05)


async def create_claim(api: httpx.AsyncClient, **spec: Any) -> dict[str, Any]:
    """Create a claim over REST (low priority, 20 %, 2 GiB unless `spec` says otherwise)."""
    body = {"priority": "low", "vcore": 20, "vmemory": "2Gi"} | spec
    response = await api.post("/v1/claims", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def ready_claim(
    api: httpx.AsyncClient, within_s: float = 20.0, **spec: Any
) -> dict[str, Any]:
    """Create a claim and wait until it is ready."""
    created = await create_claim(api, **spec)
    return await claim_until(api, created["id"], "ready", within_s)


async def claim_until(
    api: httpx.AsyncClient, claim_id: str, status: str, within_s: float = 20.0
) -> dict[str, Any]:
    """The claim once it has `status` (polled over REST)."""
    found: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal found
        found = (await api.get(f"/v1/claims/{claim_id}")).json()
        return found.get("status") == status

    await eventually(reached, within_s)
    return found


@pytest.fixture(scope="session")
async def api_url(database_url: str, bus_url: str, allocator: Allocator) -> AsyncIterator[str]:
    """The API on a real HTTP port, for the CLI run as a separate process."""
    from qshare.stack import serving
    from qshare.testing.servers import free_port

    port = free_port()
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, port=port, cluster=RULES,
        bootstrap_admin_token=ADMIN_TOKEN,
    )  # fmt: skip
    async with serving(create_app(settings), "127.0.0.1", port, grace_s=1):
        yield f"http://127.0.0.1:{port}"


class Restarts:
    """Stops and starts the session's preemptor (a new process would start the same way)."""

    def __init__(self, preemptor: Preemptor) -> None:
        self.preemptor = preemptor
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True
        await self.preemptor.stop()

    async def start(self) -> None:
        await self.preemptor.start()
        self.stopped = False


@pytest.fixture
async def restartable(preemptor: Preemptor) -> AsyncIterator[Restarts]:
    """The session's preemptor, for a test that stops and starts it; running again after."""
    restarts = Restarts(preemptor)
    yield restarts
    if restarts.stopped:
        await preemptor.start()


@pytest.fixture
async def scratch_url(database_url: str) -> AsyncIterator[str]:
    """A fresh, empty database on the session's server; dropped after the test."""
    name = f"qshare_migration_{os.getpid()}"
    admin = create_async_engine(database_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        await conn.execute(text(f"CREATE DATABASE {name}"))
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    await admin.dispose()


async def preemption_columns_after_downgrade(url: str, revision: str) -> list[str]:
    """Downgrade the database at `url` to `revision`; the columns `preemptions` has then."""
    await asyncio.to_thread(command.downgrade, alembic_config(url), revision)
    engine = create_async_engine(url)
    columns = text(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'preemptions'"
    )
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(columns)).scalars().all())
    finally:
        await engine.dispose()
