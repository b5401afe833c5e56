"""The whole qshare stack in one process, on embedded servers: Postgres and NATS (with
JetStream) from their wheels, the allocator, the REST API, the preemptor and simulated node
agents over the real driver. `qshare up`, `make demo` and the cluster benchmark use it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from qshare import bus
from qshare.natsauth import NatsAuth, ServiceRole, identity_env
from qshare.settings import ClusterSettings
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, ServiceProcess, free_port


@dataclass
class StackOptions:
    nodes: int = 2
    cards: int = 2
    card_memory: str = "16Gi"
    port: int = 0
    host: str = "127.0.0.1"
    durable: bool = True
    shm_dir: Path | None = None
    release_delay_s: float = 0.1
    heartbeat_s: float = 2.0
    node_prefix: str = "sim"
    rules: ClusterSettings = field(default_factory=lambda: ClusterSettings(node_timeout_s=10))
    service_processes: bool = False
    """Run the allocator and the preemptor as their own processes, as in a deployment (the
    benchmark), rather than in this process's event loop (`qshare up`, the demo)."""


@dataclass
class Stack:
    url: str
    admin_token: str
    database_url: str
    nats_url: str
    agents: list[Any]
    allocator: Any
    preemptor: Any
    identities: NatsAuth

    async def connect(self, name: str, role: ServiceRole = ServiceRole.OPERATOR) -> Client:
        """A NATS connection as `role` (tools and tests: the operator, who may do anything;
        integrations: ServiceRole.INTEGRATION, read-only events)."""
        return await bus.connect(
            bus.options_for(self.nats_url, name, self.identities.credentials(role))
        )


DISPATCH_SCAN_S = 0.5
"""How often the stack's allocator re-sends desired state to lagging nodes."""


def _node_names(options: StackOptions) -> list[str]:
    return [f"{options.node_prefix}-{i}" for i in range(1, options.nodes + 1)]


def _as(identities: NatsAuth, role: ServiceRole, node: str | None = None) -> dict[str, Any]:
    found = identities.credentials(role, node)
    return {"nats_user": found.user, "nats_password": found.password}


@contextlib.asynccontextmanager
async def running_stack(options: StackOptions) -> AsyncIterator[Stack]:
    """Start everything, yield it, stop everything (in reverse order) on exit."""
    from qshare_allocator.migrate import upgrade

    identities = NatsAuth.generate(nodes=_node_names(options))
    async with (
        EmbeddedPostgres(durable=options.durable) as pg,
        EmbeddedNats(config=identities.server_config()) as server,
    ):
        await upgrade(pg.url)
        async with _services(options, pg.url, server.url, identities) as stack:
            yield stack


@contextlib.asynccontextmanager
async def _services(
    options: StackOptions, db: str, url: str, identities: NatsAuth
) -> AsyncIterator[Stack]:
    token = "qs_" + secrets.token_urlsafe(24)
    port = options.port or free_port()
    control = _processes if options.service_processes else _in_process
    api = _api(options, db, url, port, token, _as(identities, ServiceRole.API))
    async with control(options, db, url, identities) as (allocator, preemptor), api:
        agents = await _start_agents(options, url, identities)
        try:
            http = f"http://{options.host}:{port}"
            yield Stack(http, token, db, url, agents, allocator, preemptor, identities)
        finally:
            await asyncio.gather(*(agent.stop() for agent in agents))


@contextlib.asynccontextmanager
async def _in_process(
    options: StackOptions, db: str, url: str, identities: NatsAuth
) -> AsyncIterator[tuple[Any, Any]]:
    """The allocator and the preemptor in this process's event loop."""
    from qshare_allocator.app import Allocator
    from qshare_allocator.settings import AllocatorSettings
    from qshare_preemptor.app import Preemptor
    from qshare_preemptor.settings import PreemptorSettings

    allocator = Allocator(AllocatorSettings(
        database_url=db, nats_url=url, cluster=options.rules, instance="up",
        dispatch_scan_s=DISPATCH_SCAN_S, **_as(identities, ServiceRole.ALLOCATOR),
    ))  # fmt: skip
    preemptor = Preemptor(PreemptorSettings(
        database_url=db, nats_url=url, instance="up", **_as(identities, ServiceRole.PREEMPTOR)
    ))  # fmt: skip
    async with allocator, preemptor:
        yield allocator, preemptor


@contextlib.asynccontextmanager
async def _processes(
    options: StackOptions, db: str, url: str, identities: NatsAuth
) -> AsyncIterator[tuple[Any, Any]]:
    """The allocator and the preemptor as `python -m` processes, configured by environment."""
    allocator_env = {
        "QSHARE_ALLOCATOR_DATABASE_URL": db,
        "QSHARE_ALLOCATOR_NATS_URL": url,
        "QSHARE_ALLOCATOR_INSTANCE": "up",
        "QSHARE_ALLOCATOR_DISPATCH_SCAN_S": str(DISPATCH_SCAN_S),
        "QSHARE_ALLOCATOR_CLUSTER": options.rules.model_dump_json(),
    } | identity_env("QSHARE_ALLOCATOR_", identities.credentials(ServiceRole.ALLOCATOR))
    preemptor_env = {
        "QSHARE_PREEMPTOR_DATABASE_URL": db,
        "QSHARE_PREEMPTOR_NATS_URL": url,
        "QSHARE_PREEMPTOR_INSTANCE": "up",
    } | identity_env("QSHARE_PREEMPTOR_", identities.credentials(ServiceRole.PREEMPTOR))
    async with (
        ServiceProcess("qshare_allocator", allocator_env, "serving") as allocator,
        ServiceProcess("qshare_preemptor", preemptor_env, "serving") as preemptor,
    ):
        yield allocator, preemptor


async def _start_agents(options: StackOptions, url: str, identities: NatsAuth) -> list[Any]:
    from qshare_node_agent.app import NodeAgent
    from qshare_node_agent.settings import NodeAgentSettings

    agents = []
    for name in _node_names(options):
        settings = NodeAgentSettings(
            name=name, nats_url=url, **_as(identities, ServiceRole.NODE, name),
            simulate=f"{options.cards}:{options.card_memory}", shm_dir=options.shm_dir,
            release_delay_s=options.release_delay_s, heartbeat_s=options.heartbeat_s,
            keep_segment_on_stop=False,
        )  # fmt: skip
        agent = NodeAgent(settings)
        await agent.start()
        agents.append(agent)
    await asyncio.gather(*(asyncio.wait_for(a.registered.wait(), 30) for a in agents))
    return agents


@contextlib.asynccontextmanager
async def _api(
    options: StackOptions, db: str, url: str, port: int, token: str, identity: dict[str, Any]
) -> AsyncIterator[None]:
    from pydantic import SecretStr

    from qshare_api.app import create_app
    from qshare_api.settings import ApiSettings

    settings = ApiSettings(database_url=db, nats_url=url, port=port, cluster=options.rules,
                           bootstrap_admin_token=SecretStr(token), **identity)  # fmt: skip
    async with serving(create_app(settings), options.host, port):
        yield


@contextlib.asynccontextmanager
async def serving(app: Any, host: str, port: int, grace_s: int = 2) -> AsyncIterator[None]:
    """An ASGI app on a real HTTP port in this event loop, until the block ends; open event
    streams are cut after `grace_s`."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace_s
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        await task
