"""`/extender/filter`, `/extender/prioritize`, `/extender/bind`: the scheduler's extender
verbs. Failures are answered in the result's `Error` field, as the scheduler expects."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from qshare_api.extender.cache import PreviewCache
from qshare_api.extender.schemas import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
)
from qshare_api.extender.service import Extender
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/extender", tags=["kubernetes scheduler extender"], responses=PROBLEMS)


async def extender(request: Request, res: Annotated[Resources, Depends(resources)]) -> Extender:
    """One preview cache per application, made on first use."""
    state = request.app.state
    if getattr(state, "preview_cache", None) is None:
        state.preview_cache = PreviewCache()
    timeout = res.settings.allocator_timeout_s
    return Extender(res.settings.extender, res.nc, res.source, timeout, state.preview_cache)


Ext = Annotated[Extender, Depends(extender)]


@router.post("/filter", response_model=ExtenderFilterResult, response_model_by_alias=True)
async def filter_nodes(args: ExtenderArgs, ext: Ext) -> ExtenderFilterResult:
    return await ext.filter(args)


@router.post("/prioritize", response_model=list[HostPriority], response_model_by_alias=True)
async def prioritize(args: ExtenderArgs, ext: Ext) -> Response:
    return Response(await ext.prioritize(args), media_type="application/json")


@router.post("/bind", response_model=ExtenderBindingResult, response_model_by_alias=True)
async def bind(args: ExtenderBindingArgs, ext: Ext) -> ExtenderBindingResult:
    return await ext.bind(args)
