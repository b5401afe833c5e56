"""Per-tenant quotas, checked in the transaction that creates the claim: memory and cards
count every claim not yet released or failed (pending ones included, so placing them later
never exceeds the quota), and a new claim that must wait is held to the pending limit. The
tenant's quota row is locked, so concurrent creates of one tenant are checked one after
another. A creation locks it in the statement that writes the claim (`with_quota_lock`,
which reads the claim's class there too) and checks the usage that statement left
(`check_written`): one round trip fewer per claim."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, bindparam, select, true
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import UpdateBase

from qshare.contracts.errors import Conflict, FieldError
from qshare.contracts.quantities import format_mib
from qshare.contracts.rows import quota_usage
from qshare.contracts.schema import quotas
from qshare_allocator.claims.classes import held_class
from qshare_allocator.db import together
from qshare_allocator.placement.demand import Demand


async def check_growth(conn: AsyncConnection, tenant: str, memory_mib: int) -> None:
    """Raise Conflict when `memory_mib` more (a resized claim) passes the memory quota."""
    if memory_mib > 0:
        await _check(conn, tenant, memory_mib, 0, 0)


def with_quota_lock(*writes: UpdateBase) -> Select[Any]:
    """`writes` as one statement (`db.together`) whose one row is the new claim's class
    (`classes.held_class`, locked: no row when it was deleted) beside the tenant's quota row
    (`q_tenant`), locked: its columns null where there is none, no limit. Built once per
    combination of writes."""
    return together(*writes, result=_class_and_quota())


async def check_written(
    conn: AsyncConnection, tenant: str, written: Sequence[Any], demand: Demand, waits: bool
) -> None:
    """After `with_quota_lock` wrote a new claim (placed, or pending when `waits`) and
    returned `written` (its rows): raise Conflict naming each memory or card limit the
    claim passes; else, for a claim that waits, when it passes the pending limit (a claim
    placed at once never counts against it). The usage read counts the new claim."""
    quota = [row for row in written if row["tenant"] is not None]
    if not quota:
        return
    limits = (quota[0]["memory_mib"], quota[0]["cards"], quota[0]["pending"])
    used = (await conn.execute(quota_usage(tenant))).one()
    memory_mib, cards = demand.vmemory_mib * demand.count, demand.count
    before = (used.memory_mib - memory_mib, used.cards - cards, used.pending - int(waits))
    _refuse_over(tenant, limits, before, (memory_mib, cards, 0))
    if waits:
        _refuse_over(tenant, limits, (used.memory_mib, used.cards, before[2]), (0, 0, 1))


async def _check(
    conn: AsyncConnection, tenant: str, memory_mib: int, cards: int, pending: int
) -> None:
    quota = (await conn.execute(_locked_quota(), {"q_tenant": tenant})).one_or_none()
    if quota is None:
        return
    used = (await conn.execute(quota_usage(tenant))).one()
    limits = (quota.memory_mib, quota.cards, quota.pending)
    in_use = (used.memory_mib, used.cards, used.pending)
    _refuse_over(tenant, limits, in_use, (memory_mib, cards, pending))


Limits = tuple[int | None, int | None, int | None]
"""A quota's memory (MiB), cards and pending limits; None: no limit."""
Amounts = tuple[int, int, int]
"""Memory (MiB), cards and pending claims."""


def _refuse_over(tenant: str, limits: Limits, used: Amounts, added: Amounts) -> None:
    """Conflict naming each limit that `used` plus `added` passes; a limit nothing is added
    to is not checked."""
    wanted = {  # field: (limit, what this adds, in use with it, how a number is shown)
        "vmemory": (limits[0], added[0], used[0] + added[0], format_mib),
        "count": (limits[1], added[1], used[1] + added[1], _cards),
        "pending": (limits[2], added[2], used[2] + added[2], _pending),
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
def _class_and_quota() -> Select[Any]:
    """The new claim's class, locked, beside its tenant's quota row, locked, if any."""
    held = held_class().cte("class_held")
    quota = _locked_quota().cte("quota_held")
    return select(held, quota).select_from(held.outerjoin(quota, true()))


@functools.cache
def _locked_quota() -> Select[tuple[object, ...]]:
    """The tenant's quota row (`q_tenant`), locked; built once."""
    return select(quotas).where(quotas.c.tenant == bindparam("q_tenant")).with_for_update()


def _cards(n: int) -> str:
    return f"{n} cards"


def _pending(n: int) -> str:
    return f"{n} pending claims"
