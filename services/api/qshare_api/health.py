"""`/healthz` (the process answers), `/readyz` (NATS connected, Postgres answering with the
schema migrated, the bootstrap admin token stored), `/metrics`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from qshare import health
from qshare.contracts.errors import Unavailable
from qshare_api import bootstrap
from qshare_api.resources import Resources, resources

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: NATS connected, Postgres answering with the schema migrated; a 503 "
    "problem document names each check that fails",
)
async def readyz(request: Request, res: Annotated[Resources, Depends(resources)]) -> Health:
    task = request.app.state.bootstrap

    async def admin_token() -> str | None:
        return bootstrap.pending(task)

    checks = {
        "nats": health.nats_connected(lambda: res.nc),
        "database": health.database_ready(lambda: res.reader),
        "bootstrap": admin_token,
    }
    shared: health.Shared = request.app.state.readiness
    verdict = await shared(lambda: health.judge(checks, "ready", "not ready"))
    if verdict.failing:
        reasons = "; ".join(f"{name}: {verdict.checks[name]}" for name in verdict.failing)
        raise Unavailable(f"not ready: {reasons}")
    return Health(status="ready")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
