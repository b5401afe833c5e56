"""The FastAPI application: resources built in the lifespan, routers, problem documents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import nats
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.contracts.domain import Role
from qshare.contracts.tracing import setup_tracing
from qshare_api import health, problems
from qshare_api.claims.endpoints import router as claims_router
from qshare_api.classes.endpoints import router as classes_router
from qshare_api.extender.endpoints import router as extender_router
from qshare_api.extender.reaper import Reaper
from qshare_api.inventory.endpoints import router as inventory_router
from qshare_api.middleware import BodyLimit, Metrics
from qshare_api.resources import Resources
from qshare_api.settings import ApiSettings
from qshare_api.tokens.endpoints import router as tokens_router
from qshare_api.tokens.repository import ensure_token

DESCRIPTION = """
Platform teams ask for GPU slices (claims); the allocator places them on cards.
Every call needs `Authorization: Bearer <token>`; a tenant sees only its own claims.
Errors are RFC 9457 problem documents (`application/problem+json`) naming each bad field.
"""


def create_app(settings: ApiSettings) -> FastAPI:
    app = FastAPI(
        title="qshare API",
        version="1.0",
        description=DESCRIPTION,
        lifespan=_lifespan(settings),
    )
    for router in (claims_router, inventory_router, classes_router, tokens_router, health.router):
        app.include_router(router)
    if settings.extender.enabled:
        app.include_router(extender_router)
    problems.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Metrics)
    return app


def _lifespan(settings: ApiSettings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        setup_tracing("qshare-api", settings.trace_console)
        engine = create_async_engine(
            settings.database_url, pool_size=settings.pool_size, max_overflow=4
        )
        nc = await nats.connect(settings.nats_url, name=f"qshare-api/{settings.instance}")
        reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        app.state.resources = Resources(settings, engine, reader, nc)
        await _bootstrap_admin(app.state.resources)
        reaper = _start_reaper(app.state.resources) if settings.extender.enabled else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
            await nc.drain()
            await engine.dispose()

    return lifespan


def _start_reaper(res: Resources) -> asyncio.Task[None]:
    return asyncio.create_task(Reaper(res).run(res.settings.extender.reap_s))


async def _bootstrap_admin(res: Resources) -> None:
    secret = res.settings.bootstrap_admin_token
    if secret is not None:
        async with res.engine.begin() as conn:
            await ensure_token(
                conn, "bootstrap admin", "admin", Role.ADMIN, secret.get_secret_value()
            )
