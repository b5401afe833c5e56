"""`/healthz` (the process answers), `/readyz` (Postgres and NATS reachable), `/metrics`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy import text

from qshare.contracts.errors import Unavailable
from qshare_api.resources import Resources, resources

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="Readiness: Postgres and NATS reachable")
async def readyz(res: Annotated[Resources, Depends(resources)]) -> Health:
    if not res.nc.is_connected:
        raise Unavailable("NATS is not connected")
    try:
        async with res.reader.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        raise Unavailable("Postgres is not reachable") from exc
    return Health(status="ready")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
