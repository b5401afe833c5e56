"""Per-tenant quotas, checked in the transaction that creates the claim: memory and cards
count every claim not yet released or failed (pending ones included, so placing them later
never exceeds the quota), and pending claims are limited too. The tenant's quota row is
locked, so concurrent creates of one tenant are checked one after another."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import Conflict, FieldError
from qshare.contracts.schema import claims, quotas
from qshare_allocator.placement.demand import Demand

LIVE = (ClaimStatus.PENDING.value, ClaimStatus.PLACED.value, ClaimStatus.READY.value)


async def check_quota(conn: AsyncConnection, tenant: str, demand: Demand) -> None:
    """Raise Conflict naming each limit the new claim would pass; no quota row: no limit."""
    await _check(conn, tenant, demand.vmemory_mib * demand.count, demand.count, 1)


async def check_growth(conn: AsyncConnection, tenant: str, memory_mib: int) -> None:
    """Raise Conflict when `memory_mib` more (a resized claim) passes the memory quota."""
    if memory_mib > 0:
        await _check(conn, tenant, memory_mib, 0, 0)


async def _check(
    conn: AsyncConnection, tenant: str, memory_mib: int, cards: int, pending: int
) -> None:
    query = select(quotas).where(quotas.c.tenant == tenant).with_for_update()
    quota = (await conn.execute(query)).one_or_none()
    if quota is None:
        return
    used = (await conn.execute(_usage(tenant))).one()
    wanted = {  # field: (limit, what this adds, in use with it, unit)
        "vmemory": (quota.memory_mib, memory_mib, used.memory + memory_mib, "MiB"),
        "count": (quota.cards, cards, used.cards + cards, "cards"),
        "pending": (quota.pending, pending, used.pending + pending, "pending claims"),
    }
    errors = [
        FieldError(field=field, message=f"quota of {limit} {unit} exceeded ({total} with this)")
        for field, (limit, added, total, unit) in wanted.items()
        if limit is not None and added > 0 and total > limit
    ]
    if errors:
        raise Conflict(f"tenant {tenant}: " + "; ".join(e.message for e in errors), errors)


def _usage(tenant: str) -> Select[Any]:
    live = claims.c.status.in_(LIVE)
    return select(
        func.coalesce(func.sum(claims.c.vmemory_mib * claims.c.count).filter(live), 0).label(
            "memory"
        ),
        func.coalesce(func.sum(claims.c.count).filter(live), 0).label("cards"),
        func.count().filter(claims.c.status == ClaimStatus.PENDING.value).label("pending"),
    ).where(claims.c.tenant == tenant)
