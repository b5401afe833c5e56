"""The allocator's, the preemptor's and the node agent's /healthz and /readyz, served over
HTTP on their health port, against real Postgres and NATS: readiness follows NATS (and the
schema, for the allocator) while liveness holds; the API starts on an unmigrated database
and says not ready until the schema is there. Each test owns its NATS server and database
(on the session's Postgres server), so the outages touch no other test's services."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare import health as health_module
from qshare.bus import connect, options_for
from qshare.contracts import rpc, subjects
from qshare.contracts.errors import Unavailable
from qshare.contracts.preemption import ClaimAction, ClaimActionReply
from qshare.service import Service, cancelled
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, ServiceProcess, free_port
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api import bootstrap
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings
from qshare_preemptor import app as preemptor_app
from qshare_preemptor.app import Preemptor
from qshare_preemptor.settings import PreemptorSettings

from .conftest import ADMIN_TOKEN, RULES, auth, eventually

RECONNECT_S = 0.05
pytestmark = pytest.mark.timeout(120)
Database = Callable[[bool], Awaitable[str]]


@pytest.fixture
async def new_database(database_url: str) -> AsyncIterator[Database]:
    """Make fresh databases on the session's Postgres server (migrated when asked); each is
    dropped after the test."""
    admin = create_async_engine(database_url, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    async def make(migrated: bool) -> str:
        name = f"health_{uuid.uuid4().hex[:8]}"
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
        if migrated:
            await upgrade(url)
        return url

    yield make
    async with admin.connect() as conn:
        for name in made:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    await admin.dispose()


@pytest.fixture
async def bus() -> AsyncIterator[EmbeddedNats]:
    async with EmbeddedNats() as server:
        yield server


async def probe(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def answers(port: int, path: str, status: int) -> bool:
    """Whether `path` answers `status` (False while nothing listens yet)."""
    try:
        return (await probe(port, path)).status_code == status
    except httpx.ConnectError:
        return False


def health(port: int) -> dict[str, Any]:
    return {"health_port": port, "nats_reconnect_wait_s": RECONNECT_S}


async def allocator(stack: AsyncExitStack, url: str, nats: str, port: int = 0) -> Allocator:
    settings = AllocatorSettings(database_url=url, nats_url=nats, instance="health",
                                 cluster=RULES, **health(port))  # fmt: skip
    return await stack.enter_async_context(Allocator(settings))


async def preemptor(stack: AsyncExitStack, url: str, nats: str, port: int) -> Preemptor:
    settings = PreemptorSettings(database_url=url, nats_url=nats, instance="health", **health(port))
    return await stack.enter_async_context(Preemptor(settings))


async def node_agent(stack: AsyncExitStack, url: str, nats: str, port: int, shm: Path) -> NodeAgent:
    await allocator(stack, url, nats)  # it registers with one
    settings = NodeAgentSettings(name=f"health-{uuid.uuid4().hex[:6]}", nats_url=nats,
                                 simulate="1:8Gi", shm_dir=shm, keep_segment_on_stop=False,
                                 heartbeat_s=0.5, **health(port))  # fmt: skip
    return await stack.enter_async_context(NodeAgent(settings))


SERVICES = ["allocator", "preemptor", "node agent"]


async def start(
    kind: str, stack: AsyncExitStack, url: str, nats: str, port: int, shm: Path
) -> Service:
    if kind == "allocator":
        return await allocator(stack, url, nats, port)
    if kind == "preemptor":
        return await preemptor(stack, url, nats, port)
    return await node_agent(stack, url, nats, port, shm)


@pytest.mark.parametrize("kind", SERVICES)
async def test_readiness_goes_false_while_nats_is_down_and_liveness_stays_true(
    kind: str, new_database: Database, bus: EmbeddedNats, tmp_path: Path
) -> None:
    port = free_port()
    async with AsyncExitStack() as stack:
        await start(kind, stack, await new_database(True), bus.url, port, tmp_path)
        await eventually(lambda: answers(port, "/readyz", 200))
        await bus.stop()
        await eventually(lambda: answers(port, "/readyz", 503))
        down = (await probe(port, "/readyz")).json()
        assert down["status"] == "not ready" and "nats" in down["failing"], down
        assert down["checks"]["nats"] == "disconnected; reconnecting"
        live = await probe(port, "/healthz")
        assert live.status_code == 200 and live.json()["status"] == "live", live.text
        await bus.start()
        await eventually(lambda: answers(port, "/readyz", 200))


async def test_every_check_of_the_node_agent_is_named_in_its_answers(
    new_database: Database, bus: EmbeddedNats, tmp_path: Path
) -> None:
    port = free_port()
    async with AsyncExitStack() as stack:
        await node_agent(stack, await new_database(True), bus.url, port, tmp_path)
        await eventually(lambda: answers(port, "/readyz", 200))
        body = (await probe(port, "/readyz")).json()
        live = (await probe(port, "/healthz")).json()
    assert live["checks"] == {"nats": "ok", "tasks": "ok", "event reader": "ok"}
    assert body == {
        "status": "ready",
        "failing": [],
        "checks": {"serving": "ok", "nats": "ok", "segment": "ok", "registration": "ok"},
    }


async def test_the_allocator_is_not_ready_on_an_unmigrated_database_until_it_is_migrated(
    new_database: Database, bus: EmbeddedNats
) -> None:
    port = free_port()
    url = await new_database(False)
    async with AsyncExitStack() as stack:
        await allocator(stack, url, bus.url, port)
        answer = await probe(port, "/readyz")
        assert answer.status_code == 503
        assert answer.json()["failing"] == ["database"]
        assert answer.json()["checks"]["database"].startswith("schema not migrated yet")
        assert (await probe(port, "/healthz")).status_code == 200
        await upgrade(url)
        await eventually(lambda: answers(port, "/readyz", 200))


async def test_the_allocator_is_not_ready_on_a_schema_behind_its_migrations(
    new_database: Database, bus: EmbeddedNats
) -> None:
    url = await new_database(False)
    await upgrade(url, "0008")
    async with AsyncExitStack() as stack:
        running = await allocator(stack, url, bus.url)
        verdict = await running.probes.readiness()
    assert verdict.failing == ["database"]
    assert verdict.checks["database"].startswith("schema at revision 0008, not at this image's")


async def test_the_preemptor_waits_live_but_not_ready_for_an_unmigrated_schema(
    new_database: Database, bus: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first apply starts every pod at once: the preemptor waits for the allocator's
    migration instead of exiting (and crash-looping) on the missing tables."""
    monkeypatch.setattr(preemptor_app, "SCHEMA_AGAIN_S", 0.05)
    port = free_port()
    url = await new_database(False)
    settings = PreemptorSettings(database_url=url, nats_url=bus.url, health_port=port)
    running = Preemptor(settings)
    starting = asyncio.create_task(running.start())
    try:
        await eventually(lambda: answers(port, "/readyz", 503))
        assert (await probe(port, "/healthz")).status_code == 200
        checks = (await probe(port, "/readyz")).json()["checks"]
        assert checks["serving"] == "starting"
        assert checks["database"].startswith("schema not migrated yet")
        await upgrade(url)
        await starting
        assert (await probe(port, "/readyz")).status_code == 200
    finally:
        await cancelled(starting)
        await running.stop()


async def test_the_preemptor_takes_no_events_or_requests_before_the_schema_is_there(
    new_database: Database,
    bus: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Handled against missing tables, an event or a request would fail (and the event be
    lost): until the schema is there the preemptor subscribes to nothing, so a request finds
    no responder, and once it starts it asks the nodes for the card states it missed."""
    monkeypatch.setattr(preemptor_app, "SCHEMA_AGAIN_S", 0.05)
    url = await new_database(False)
    running = Preemptor(PreemptorSettings(database_url=url, nats_url=bus.url, health_port=0))
    starting = asyncio.create_task(running.start())
    try:
        async with await connect(options_for(bus.url, "test", None)) as nc:
            await eventually(lambda: _waiting_for_schema(caplog))
            await nc.publish("qshare.evt.gpu.n1.0.busy", b"{}")
            action = ClaimAction(claim_id=uuid.uuid4())
            with pytest.raises(Unavailable, match="no answer"):
                await rpc.call(nc, subjects.CLAIMS_SUSPEND, "test", action, ClaimActionReply, 1)
        await upgrade(url)
        await starting
        assert running.announce_requests == 1
        assert "preemptor task failed" not in caplog.text
    finally:
        await cancelled(starting)
        await running.stop()


async def test_a_preemptor_waiting_for_the_schema_stops_on_sigterm_leaving_no_connection(
    new_database: Database,
    bus: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The schema may never come (no migration job): Kubernetes' SIGTERM still ends the
    wait at once, and none of the wait's many looks keeps a connection open."""
    monkeypatch.setattr(preemptor_app, "SCHEMA_AGAIN_S", 0.01)
    url = await new_database(False)
    running = Preemptor(PreemptorSettings(database_url=url, nats_url=bus.url, health_port=0))
    runner = asyncio.create_task(running.run())
    await eventually(lambda: _waiting_for_schema(caplog))
    await asyncio.sleep(0.3)  # some dozens of looks
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(runner, 5)
    assert running.service is None  # stopped where it waited, never subscribed
    assert await _others_connected(url) == 0


async def _others_connected(url: str) -> int:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            query = ("SELECT count(*) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")  # fmt: skip
            return int(await conn.scalar(text(query)) or 0)
    finally:
        await engine.dispose()


async def _waiting_for_schema(caplog: pytest.LogCaptureFixture) -> bool:
    return "waiting for it" in caplog.text


async def test_the_api_starts_on_an_unmigrated_database_and_is_ready_once_it_is_migrated(
    new_database: Database, bus: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first apply: the API starts before the allocator's init container has migrated the
    schema. It stays up, says why it is not ready, and stores the bootstrap admin token once
    the schema is there."""
    monkeypatch.setattr(bootstrap, "AGAIN_S", 0.05)
    url = await new_database(False)
    settings = ApiSettings(database_url=url, nats_url=bus.url, bootstrap_admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            answer = await api.get("/readyz")
            assert answer.status_code == 503
            assert "database: schema not migrated yet" in answer.json()["detail"]
            assert "bootstrap: the bootstrap admin token waits for the schema" in answer.text
            assert (await api.get("/healthz")).status_code == 200
            await upgrade(url)
            await eventually(lambda: _ready(api))
            listed = await api.get("/v1/claims", headers=auth(ADMIN_TOKEN))
            assert listed.status_code == 200, listed.text


async def _ready(api: httpx.AsyncClient) -> bool:
    return (await api.get("/readyz")).status_code == 200


async def test_the_allocator_process_serves_its_probes_on_the_pods_address(
    new_database: Database, bus: EmbeddedNats
) -> None:
    """`python -m qshare_allocator` as the manifest runs it: the variables turn the server on."""
    port = free_port()
    env = {"QSHARE_ALLOCATOR_DATABASE_URL": await new_database(True),
           "QSHARE_ALLOCATOR_NATS_URL": bus.url, "QSHARE_ALLOCATOR_HEALTH_PORT": str(port),
           "QSHARE_ALLOCATOR_HEALTH_HOST": "0.0.0.0"}  # fmt: skip
    async with ServiceProcess("qshare_allocator", env, "serving"):
        await eventually(lambda: answers(port, "/readyz", 200))
        assert (await probe(port, "/healthz")).json()["checks"] == {"nats": "ok", "tasks": "ok"}


async def test_a_burst_of_api_readiness_probes_asks_the_database_once(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes that come together share one run of the checks (and one connection of the
    API's pool, which its requests need), as the other services' probes do."""
    asked = 0
    real = health_module.schema_revision

    async def counted(engine: AsyncEngine) -> str | None:
        nonlocal asked
        asked += 1
        return await real(engine)

    monkeypatch.setattr(health_module, "schema_revision", counted)
    answers = await asyncio.gather(*(api.get("/readyz") for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    assert asked <= 2


async def test_readiness_comes_back_after_postgres_restarts() -> None:
    """A restart of Postgres fails readiness while it is down; the pool's connections it
    broke do not keep it failing once Postgres is back."""
    async with EmbeddedPostgres(durable=False) as server:
        await upgrade(server.url)
        engine = create_async_engine(server.url)
        ready = health_module.database_ready(lambda: engine)
        try:
            assert await ready() is None
            await server.stop()
            assert (await ready() or "").startswith("unreachable: ")
            await server.start()
            await eventually(lambda: _holds(ready), within_s=15)
        finally:
            await engine.dispose()


async def _holds(check: health_module.Check) -> bool:
    return await check() is None


async def test_api_replicas_waiting_together_for_the_schema_store_the_token_once(
    new_database: Database, bus: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bootstrap, "AGAIN_S", 0.02)
    url = await new_database(False)
    settings = ApiSettings(database_url=url, nats_url=bus.url, bootstrap_admin_token=ADMIN_TOKEN)
    apps = [create_app(settings) for _ in range(3)]
    async with AsyncExitStack() as stack:
        clients = []
        for app in apps:
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url="http://t")
            clients.append(await stack.enter_async_context(client))
        await upgrade(url)
        for client in clients:
            await eventually(lambda c=client: _ready(c))
        listed = await clients[0].get("/v1/tokens", headers=auth(ADMIN_TOKEN))
        assert [t["name"] for t in listed.json()] == ["bootstrap admin"]
