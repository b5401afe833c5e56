"""`/v1/claims`: create, list, get, resize and delete claims."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response, status
from pydantic import BaseModel

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import (
    ClaimResize,
    ClaimSpec,
    ClaimView,
    CreateClaim,
    CreateClaimReply,
    DeleteClaim,
    ResizeClaim,
)
from qshare.contracts.domain import ClaimStatus, Priority
from qshare.contracts.errors import FieldError, Forbidden, InvalidInput, NotFound
from qshare.db import snapshot
from qshare_api.auth import Caller
from qshare_api.claims.repository import ClaimFilter, get_claim, list_claims
from qshare_api.params import CursorParam, NodeFilter, TenantFilter
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1/claims", tags=["claims"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


class ClaimPage(BaseModel):
    items: list[ClaimView]
    next_cursor: str | None = None


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ClaimView,
    summary="Create a claim",
    description="Placed at once when capacity allows, else `pending` with a `reason` until it "
    "fits. Repeating an `idempotency_key` returns the original claim with 200.",
    responses={200: {"model": ClaimView, "description": "the claim an idempotency key named"}},
)
async def create_claim(
    spec: ClaimSpec,
    caller: Caller,
    res: Res,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> ClaimView:
    spec = _with_idempotency_key(spec, idempotency_key)
    command = CreateClaim(tenant=caller.tenant, spec=spec)
    reply = await rpc.call(
        res.nc, subjects.CLAIMS_CREATE, res.source, command, CreateClaimReply,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip
    if not reply.created:
        response.status_code = status.HTTP_200_OK
    return reply.claim


def _with_idempotency_key(spec: ClaimSpec, header: str | None) -> ClaimSpec:
    """The key from the header or the body; both given must agree, else nothing is created."""
    if not header:
        return spec
    if spec.idempotency_key is None:
        return spec.model_copy(update={"idempotency_key": header})
    if spec.idempotency_key != header:
        message = "the Idempotency-Key header and the body's idempotency_key differ"
        raise InvalidInput(
            message,
            [FieldError(field=field, message=message) for field in _KEY_FIELDS],
        )
    return spec


_KEY_FIELDS = ("Idempotency-Key", "idempotency_key")


@router.get("", response_model=ClaimPage, summary="List claims, oldest first")
async def list_all(
    caller: Caller,
    res: Res,
    status_: Annotated[ClaimStatus | None, Query(alias="status")] = None,
    priority: Priority | None = None,
    node: NodeFilter = None,
    tenant: TenantFilter = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorParam = None,
) -> ClaimPage:
    """A tenant lists its own claims (`tenant` may name only itself); an admin every
    tenant's, or with `tenant` one tenant's."""
    if tenant is not None and tenant != caller.tenant and not caller.is_admin:
        raise Forbidden(f"tenant: only admins may list another tenant's claims ({tenant})")
    where = ClaimFilter(tenant or caller.tenant_filter(), status_, priority, node)
    async with snapshot(res.reader) as conn:  # the claims and their vGPUs of one commit
        items, following = await list_claims(conn, where, limit, cursor)
    return ClaimPage(items=items, next_cursor=following)


@router.get("/{claim_id}", response_model=ClaimView, summary="Get one claim")
async def get_one(claim_id: uuid.UUID, caller: Caller, res: Res) -> ClaimView:
    async with snapshot(res.reader) as conn:  # the claim and its vGPUs of one commit
        found = await get_claim(conn, claim_id, caller.tenant_filter())
    if found is None:
        raise NotFound(f"claim {claim_id} not found")
    return found


@router.patch("/{claim_id}", response_model=ClaimView, summary="Resize a claim")
async def resize_one(
    claim_id: uuid.UUID, change: ClaimResize, caller: Caller, res: Res
) -> ClaimView:
    """New `vcore` and/or `vmemory` per card. A placed or ready claim keeps its cards and is
    resized on them when all have room (else 409 naming the card and what it has); its node
    then applies the new limits to the running vGPUs. A pending claim waits for its new size.
    Event `resized`."""
    command = ResizeClaim(claim_id=claim_id, tenant=caller.tenant_filter(), change=change)
    return await rpc.call(
        res.nc, subjects.CLAIMS_RESIZE, res.source, command, ClaimView,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip


@router.delete(
    "/{claim_id}", response_model=ClaimView, summary="Delete a claim, releasing its vGPUs"
)
async def delete_one(claim_id: uuid.UUID, caller: Caller, res: Res) -> ClaimView:
    """The claim `releasing` until its node confirms its vGPUs are gone (then `released`,
    event `released`), or `released` at once where no node agent holds them. Deleting a
    releasing or released claim again returns it unchanged."""
    command = DeleteClaim(claim_id=claim_id, tenant=caller.tenant_filter())
    return await rpc.call(
        res.nc, subjects.CLAIMS_DELETE, res.source, command, ClaimView,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip
