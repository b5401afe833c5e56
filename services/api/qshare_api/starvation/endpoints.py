"""`GET /v1/starvation`: low-priority claims the preemptor's starvation watch found starved
(which claim, which card, the shares that decided it, when, and where it was moved)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from qshare.contracts.schema import starvations
from qshare_api.auth import Caller
from qshare_api.history import Before, Limit, matching, newest_first
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
    limit: Limit = 100,
    before: Before = None,
) -> list[Starvation]:
    """Newest first; `before` (the last id of a page) gives the page after it."""
    tenant = caller.tenant_filter()
    where = matching(
        None if tenant is None else starvations.c.tenant == tenant,
        None if claim is None else starvations.c.claim_id == claim,
    )
    async with res.reader.connect() as conn:
        rows = await newest_first(conn, starvations, where, limit, before)
    return [
        Starvation(
            id=r.id, claim_id=r.claim_id, tenant=r.tenant, gpu=r.gpu_uuid, node=r.node_name,
            share=r.share, harvestable_share=r.harvestable_share, window_s=r.window_s,
            open=r.ended_at is None, moved_to=r.moved_to, note=r.note,
            started_at=r.started_at, ended_at=r.ended_at,
        )
        for r in rows
    ]  # fmt: skip
