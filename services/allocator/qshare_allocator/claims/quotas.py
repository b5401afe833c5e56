"""Per-tenant quotas, checked in the transaction that creates the claim: memory and cards
count every claim not yet released or failed (pending ones included, so placing them later
never exceeds the quota), and a new claim that must wait is held to the pending limit. The
tenant's quota row is locked, so concurrent creates of one tenant are checked one after
another."""

from __future__ import annotations

import functools

from sqlalchemy import Select, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.errors import Conflict, FieldError
from qshare.contracts.quantities import format_mib
from qshare.contracts.rows import quota_usage
from qshare.contracts.schema import quotas
from qshare_allocator.placement.demand import Demand


async def check_quota(conn: AsyncConnection, tenant: str, demand: Demand) -> None:
    """Raise Conflict naming each memory or card limit the new claim would pass; no quota
    row: no limit. Its pending limit is checked once it is known to wait (`check_pending`)."""
    await _check(conn, tenant, demand.vmemory_mib * demand.count, demand.count, 0)


async def check_pending(conn: AsyncConnection, tenant: str) -> None:
    """Raise Conflict when one more pending claim (a new one that must wait) passes the
    pending limit; a claim placed at once never counts against it."""
    await _check(conn, tenant, 0, 0, 1)


async def check_growth(conn: AsyncConnection, tenant: str, memory_mib: int) -> None:
    """Raise Conflict when `memory_mib` more (a resized claim) passes the memory quota."""
    if memory_mib > 0:
        await _check(conn, tenant, memory_mib, 0, 0)


async def _check(
    conn: AsyncConnection, tenant: str, memory_mib: int, cards: int, pending: int
) -> None:
    quota = (await conn.execute(_locked_quota(), {"q_tenant": tenant})).one_or_none()
    if quota is None:
        return
    used = (await conn.execute(quota_usage(tenant))).one()
    wanted = {  # field: (limit, what this adds, in use with it, how a number is shown)
        "vmemory": (quota.memory_mib, memory_mib, used.memory_mib + memory_mib, format_mib),
        "count": (quota.cards, cards, used.cards + cards, _cards),
        "pending": (quota.pending, pending, used.pending + pending, _pending),
    }
    errors = [
        FieldError(field=field, message=f"quota of {shown(limit)} exceeded ({shown(total)} "
                   "with this)")
        for field, (limit, added, total, shown) in wanted.items()
        if limit is not None and added > 0 and total > limit
    ]  # fmt: skip
    if errors:
        raise Conflict(f"tenant {tenant}: " + "; ".join(e.message for e in errors), errors)


@functools.cache
def _locked_quota() -> Select[tuple[object, ...]]:
    """The tenant's quota row, locked; built once (a claim creation runs it every time)."""
    return select(quotas).where(quotas.c.tenant == bindparam("q_tenant")).with_for_update()


def _cards(n: int) -> str:
    return f"{n} cards"


def _pending(n: int) -> str:
    return f"{n} pending claims"
