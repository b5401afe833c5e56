"""`/v1/quotas`: admins set, list and clear per-tenant quotas (the allocator enforces them
when a claim is created); `/v1/me/quota`: a tenant reads its own quota and usage (not
under `/v1/quotas/`, where `me` would be a tenant's name)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert

from qshare.contracts.claims import WHOLE, MemoryMiB
from qshare.contracts.errors import Forbidden, NotFound
from qshare.contracts.rows import quota_usage
from qshare.contracts.schema import quotas
from qshare_api.auth import Admin, Caller
from qshare_api.pages import PageLimit, decode, fetched, page
from qshare_api.params import CursorParam, TenantFilter, TenantName, TenantPath
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1/quotas", tags=["quotas"], responses=PROBLEMS)
own = APIRouter(prefix="/v1/me", tags=["quotas"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]
Limit = Annotated[int | None, Field(ge=0, le=1_000_000), WHOLE]


class QuotaSpec(BaseModel):
    """Limits of one tenant (null: no limit). PUT: a missing limit is no limit; PATCH: a
    missing limit is kept."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"memory": "64Gi", "cards": 8, "pending": 20}]},
    )

    memory: MemoryMiB | None = Field(None, description="memory its live claims may ask for")
    cards: Limit = Field(None, description="vGPUs its live claims may ask for")
    pending: Limit = Field(None, description="claims it may have pending at once")


class Quota(BaseModel):
    tenant: str
    memory_mib: int | None
    cards: int | None
    pending: int | None


class Usage(BaseModel):
    memory_mib: int = Field(description="memory its live claims ask for, MiB")
    cards: int = Field(description="vGPUs its live claims ask for")
    pending: int = Field(description="its claims pending now")


class QuotaAndUsage(Quota):
    """A tenant's limits (null: no limit, also when it has no quota) and what it uses."""

    usage: Usage


@own.get("/quota", response_model=QuotaAndUsage, summary="The caller's quota and usage")
async def my_quota(caller: Caller, res: Res, tenant: TenantFilter = None) -> QuotaAndUsage:
    """A tenant reads only its own; an admin reads its own or, with `tenant`, anyone's."""
    if tenant is not None and tenant != caller.tenant and not caller.is_admin:
        raise Forbidden("only admins may read another tenant's quota")
    whose = tenant or caller.tenant
    async with res.reader.connect() as conn:
        row = (await conn.execute(select(quotas).where(quotas.c.tenant == whose))).one_or_none()
        used = (await conn.execute(quota_usage(whose))).one()
    limits = row._mapping if row is not None else {}
    return QuotaAndUsage(
        tenant=whose, memory_mib=limits.get("memory_mib"), cards=limits.get("cards"),
        pending=limits.get("pending"), usage=Usage.model_validate(used._mapping),
    )  # fmt: skip


@router.put("/{tenant:path}", response_model=Quota, summary="Set a tenant's whole quota (admins)")
async def set_quota(tenant: TenantPath, body: QuotaSpec, caller: Admin, res: Res) -> Quota:
    """Replaces the quota: a limit the body leaves out is no limit (PATCH changes some)."""
    return await _upsert(res, tenant, body.model_dump())


@router.patch("/{tenant:path}", response_model=Quota, summary="Change some of a tenant's limits")
async def change_quota(tenant: TenantPath, body: QuotaSpec, caller: Admin, res: Res) -> Quota:
    """Admins. Only the limits the body names change (`null`: no limit), the others are
    kept; a tenant without a quota gets one with just these limits. An empty body `{}`
    changes nothing: it returns the quota as it is, or 404 where the tenant has none (as a
    PATCH of a missing claim is 404); a body that only removes limits (all `null`) is 404
    there too, so a PATCH never creates an empty quota."""
    limits = body.model_dump(exclude_unset=True)
    if all(limit is None for limit in limits.values()):  # `{}` too: nothing to add
        return await _changed_only(res, tenant, limits)
    return await _upsert(res, tenant, limits)


async def _changed_only(res: Resources, tenant: str, limits: dict[str, int | None]) -> Quota:
    """`tenant`'s quota without `limits` (all None, or none at all), or 404 where it has none,
    in one statement: a quota cleared meanwhile is not made again."""
    values = {COLUMNS[k]: v for k, v in limits.items()} | {"updated_at": func.now()}
    statement = update(quotas).where(quotas.c.tenant == tenant).values(values).returning(*SHOWN)
    async with res.engine.begin() as conn:
        stored = (await conn.execute(statement)).one_or_none()
    if stored is None:
        raise NotFound(f"tenant {tenant} has no quota: a PATCH that sets no limit changes none")
    return Quota.model_validate(stored._mapping)


COLUMNS = {"memory": "memory_mib", "cards": "cards", "pending": "pending"}
"""A QuotaSpec field's column in `quotas`."""
SHOWN = (quotas.c.tenant, quotas.c.memory_mib, quotas.c.cards, quotas.c.pending)
"""The columns a Quota shows."""


async def _upsert(res: Resources, tenant: str, limits: dict[str, int | None]) -> Quota:
    """Store `limits` (by QuotaSpec field) for `tenant`, leaving its other columns alone."""
    values = {COLUMNS[k]: v for k, v in limits.items()}
    row = insert(quotas).values({"tenant": tenant} | values)
    statement = row.on_conflict_do_update(
        index_elements=[quotas.c.tenant],
        set_={k: row.excluded[k] for k in values} | {"updated_at": func.now()},
    ).returning(*SHOWN)
    async with res.engine.begin() as conn:
        stored = (await conn.execute(statement)).one()
    return Quota.model_validate(stored._mapping)


@router.get("", response_model=list[Quota], summary="List quotas (admins)")
async def list_quotas(
    caller: Admin,
    res: Res,
    request: Request,
    response: Response,
    limit: PageLimit = None,
    cursor: CursorParam = None,
) -> list[Quota]:
    """By tenant; with `limit`, a page, the next one named by the Link header."""
    query = select(*SHOWN).order_by(quotas.c.tenant).limit(fetched(limit))
    if (after := decode(cursor, AFTER)) is not None:
        query = query.where(quotas.c.tenant > after[0])
    async with res.reader.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [
        Quota.model_validate(r._mapping)
        for r in page(rows, limit, lambda r: (r.tenant,), request, response)
    ]


AFTER = TypeAdapter(tuple[TenantName])
"""A quotas cursor: the last tenant listed."""


@router.delete(
    "/{tenant:path}", status_code=status.HTTP_204_NO_CONTENT, summary="Clear a quota (admins)"
)
async def clear_quota(tenant: TenantPath, caller: Admin, res: Res) -> None:
    async with res.engine.begin() as conn:
        gone = await conn.execute(
            delete(quotas).where(quotas.c.tenant == tenant).returning(quotas.c.tenant)
        )
        if gone.scalar_one_or_none() is None:
            raise NotFound(f"tenant {tenant} has no quota")
