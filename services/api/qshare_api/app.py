"""The FastAPI application: resources built in the lifespan, routers, problem documents."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from qshare import bus
from qshare.contracts.tracing import flush_tracing, setup_tracing
from qshare.health import Shared
from qshare.metrics_http import serve_metrics
from qshare.service import settle_heap
from qshare_api import health, problems
from qshare_api.bootstrap import bootstrap_admin
from qshare_api.claims.endpoints import router as claims_router
from qshare_api.classes.endpoints import router as classes_router
from qshare_api.events.endpoints import router as events_router
from qshare_api.events.slots import StreamSlots
from qshare_api.extender.endpoints import router as extender_router
from qshare_api.extender.reaper import Reaper
from qshare_api.failures import FailedAuth
from qshare_api.inventory.endpoints import router as inventory_router
from qshare_api.middleware import BodyLimit, Metrics
from qshare_api.preemptions.endpoints import actions as claim_actions_router
from qshare_api.preemptions.endpoints import router as preemptions_router
from qshare_api.quotas.endpoints import own as own_quota_router
from qshare_api.quotas.endpoints import router as quotas_router
from qshare_api.ratelimit import RateLimiter
from qshare_api.resources import Resources
from qshare_api.settings import ApiSettings
from qshare_api.starvation.endpoints import router as starvation_router
from qshare_api.tokens.endpoints import router as tokens_router

log = logging.getLogger(__name__)

DESCRIPTION = """
Platform teams ask for GPU slices (claims); the allocator places them on cards.
Every call needs `Authorization: Bearer <token>`; a tenant sees only its own claims.
Errors are RFC 9457 problem documents (`application/problem+json`) naming each bad field.
"""


def create_app(settings: ApiSettings, own_process: bool = False) -> FastAPI:
    """The application; `own_process` when it is the process's only one (`python -m
    qshare_api`): its start-up heap is then frozen out of the garbage collector's passes."""
    app = FastAPI(
        title="qshare API",
        version="1.0",
        description=DESCRIPTION,
        lifespan=_lifespan(settings, own_process),
    )
    routers = (
        claims_router, claim_actions_router, inventory_router, classes_router, tokens_router,
        quotas_router, own_quota_router, preemptions_router, events_router, starvation_router,
    )  # fmt: skip
    for router in (*routers, health.router):
        app.include_router(router)
    if settings.extender.enabled:
        app.include_router(extender_router)
    problems.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Metrics)
    return app


def _lifespan(
    settings: ApiSettings, own_process: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = serve_metrics(settings)  # a taken port stops the start before anything opens
        try:
            async with _serving(app, settings, own_process):
                yield
        finally:
            if metrics is not None:
                metrics.stop()

    return lifespan


@asynccontextmanager
async def _serving(app: FastAPI, settings: ApiSettings, own_process: bool) -> AsyncIterator[None]:
    setup_tracing("qshare-api", settings.trace_console)
    engine = create_async_engine(
        settings.database_url, pool_size=settings.pool_size, max_overflow=4
    )
    nc = await bus.connect(settings.bus(f"qshare-api/{settings.instance}"))
    reader = engine.execution_options(isolation_level="AUTOCOMMIT")
    limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
    streams = StreamSlots(settings.max_event_streams_per_token)
    failures = FailedAuth(
        settings.auth_failures_per_s, settings.auth_failure_burst, settings.trusted_proxies
    )
    app.state.resources = Resources(settings, engine, reader, nc, limiter, streams, failures)
    try:
        app.state.bootstrap = await bootstrap_admin(engine, settings.bootstrap_secret())
    except BaseException:  # a failed start releases what it had opened
        await bus.close(nc)
        await engine.dispose()
        raise
    app.state.readiness = Shared()  # the run of /readyz's checks probes share
    reaper = _start_reaper(app.state.resources) if settings.extender.enabled else None
    if own_process:
        settle_heap()
    try:
        yield
    finally:
        for task in (reaper, app.state.bootstrap):
            if task is not None:
                task.cancel()
        await bus.close(nc)
        await engine.dispose()
        await asyncio.to_thread(flush_tracing)


def _start_reaper(res: Resources) -> asyncio.Task[None]:
    return asyncio.create_task(Reaper(res).run(res.settings.extender.reap_s))
