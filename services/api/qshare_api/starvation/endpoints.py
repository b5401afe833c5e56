"""`GET /v1/starvation`: low-priority claims the preemptor's starvation watch found starved
(which claim, which card, the shares that decided it, when, and where it was moved)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field
from sqlalchemy import select

from qshare.contracts.schema import starvations
from qshare_api.auth import Caller
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1/starvation", tags=["preemptions"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


class Starvation(BaseModel):
    id: int
    claim_id: uuid.UUID
    tenant: str
    gpu: str
    node: str
    share: float = Field(description="the claim's device time over the window, per window")
    harvestable_share: float = Field(description="the card's time high priority left, per window")
    window_s: float
    open: bool = Field(description="still starved on that card")
    moved_to: str | None = Field(description="the card it was moved to, if it was")
    note: str
    started_at: datetime
    ended_at: datetime | None


@router.get("", response_model=list[Starvation], summary="Starved claims, newest first")
async def list_starvation(
    caller: Caller,
    res: Res,
    claim: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[Starvation]:
    query = select(starvations).order_by(starvations.c.started_at.desc()).limit(limit)
    if (tenant := caller.tenant_filter()) is not None:
        query = query.where(starvations.c.tenant == tenant)
    if claim is not None:
        query = query.where(starvations.c.claim_id == claim)
    async with res.reader.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [
        Starvation(
            id=r.id, claim_id=r.claim_id, tenant=r.tenant, gpu=r.gpu_uuid, node=r.node_name,
            share=r.share, harvestable_share=r.harvestable_share, window_s=r.window_s,
            open=r.ended_at is None, moved_to=r.moved_to, note=r.note,
            started_at=r.started_at, ended_at=r.ended_at,
        )
        for r in rows
    ]  # fmt: skip
