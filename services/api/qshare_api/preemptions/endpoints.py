"""`POST /v1/claims/{id}/suspend|resume` (carried to the nodes by the preemptor) and
`GET /v1/preemptions` (which claim, which card, when, how long, why)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import Text
from qshare.contracts.preemption import ClaimAction, ClaimActionReply
from qshare.contracts.schema import preemptions
from qshare_api.auth import Caller
from qshare_api.history import Before, Limit, matching, newest_first
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

actions = APIRouter(prefix="/v1/claims", tags=["claims"], responses=PROBLEMS)
router = APIRouter(prefix="/v1/preemptions", tags=["preemptions"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


class Preemption(BaseModel):
    id: int
    claim_id: uuid.UUID
    tenant: str
    gpu: str | None
    busy_gpus: list[str] | None = Field(
        None,
        description="a gang record's cards whose high priority holds the claim suspended "
        "(while open; a closed record keeps the last)",
    )
    node: str | None
    kind: str
    reason: str
    started_at: datetime
    ended_at: datetime | None
    seconds: float | None
    suspended_by: str | None = Field(
        None,
        description="an operator record's token that suspended the claim, as '<token name> "
        "(token <id>)'; null on the records the control plane opens itself",
    )
    resumed_by: str | None = Field(
        None, description="an operator record's token that resumed the claim (once closed)"
    )


class ActionBody(BaseModel):
    """What an operator may say of a suspend or resume."""

    model_config = ConfigDict(extra="forbid")

    reason: Text = Field(
        "operator",
        description="why, recorded in the preemption record (a suspend's) and carried to the "
        "node agents' logs; no NUL, at most 253 characters",
        examples=["node maintenance at 14:00"],
    )


async def _act(
    claim_id: uuid.UUID, caller: Caller, res: Resources, suspend: bool, body: ActionBody | None
) -> ClaimActionReply:
    subject = subjects.CLAIMS_SUSPEND if suspend else subjects.CLAIMS_RESUME
    reason = (body or ActionBody()).reason
    action = ClaimAction(
        claim_id=claim_id, tenant=caller.tenant_filter(), reason=reason, actor=caller.actor
    )
    return await rpc.call(res.nc, subject, res.source, action, ClaimActionReply,
                          timeout=res.settings.allocator_timeout_s)  # fmt: skip


@actions.post("/{claim_id}/suspend", response_model=ClaimActionReply, summary="Suspend a claim")
async def suspend(
    claim_id: uuid.UUID, caller: Caller, res: Res, body: ActionBody | None = None
) -> ClaimActionReply:
    """Every vGPU of the claim stops at its next launch and stays stopped until resumed
    (its memory stays resident); recorded as an `operator` preemption naming the caller's
    token (`suspended_by`) and the body's `reason` (optional)."""
    return await _act(claim_id, caller, res, True, body)


@actions.post("/{claim_id}/resume", response_model=ClaimActionReply, summary="Resume a claim")
async def resume(
    claim_id: uuid.UUID, caller: Caller, res: Res, body: ActionBody | None = None
) -> ClaimActionReply:
    """Ends the operator's suspension; the record names the caller's token (`resumed_by`)."""
    return await _act(claim_id, caller, res, False, body)


@router.get("", response_model=list[Preemption], summary="Preemptions, newest first")
async def list_preemptions(
    caller: Caller,
    res: Res,
    claim: uuid.UUID | None = None,
    kind: Literal["gang", "operator", "eviction"] | None = None,
    limit: Limit = 100,
    before: Before = None,
) -> list[Preemption]:
    """Newest first; `before` (the last id of a page) gives the page after it."""
    tenant = caller.tenant_filter()
    where = matching(
        None if tenant is None else preemptions.c.tenant == tenant,
        None if claim is None else preemptions.c.claim_id == claim,
        None if kind is None else preemptions.c.kind == kind,
    )
    async with res.reader.connect() as conn:
        rows = await newest_first(conn, preemptions, where, limit, before)
    return [
        Preemption(
            id=r.id, claim_id=r.claim_id, tenant=r.tenant, gpu=r.gpu_uuid,
            busy_gpus=r.busy_gpus, node=r.node_name, kind=r.kind, reason=r.reason,
            started_at=r.started_at, ended_at=r.ended_at,
            seconds=(r.ended_at - r.started_at).total_seconds() if r.ended_at else None,
            suspended_by=r.suspended_by, resumed_by=r.resumed_by,
        )
        for r in rows
    ]  # fmt: skip
