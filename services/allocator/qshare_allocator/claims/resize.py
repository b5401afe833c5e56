"""Resizing a claim in place (`PATCH /v1/claims/{id}`): a placed or ready claim's vGPUs get
the new core share and memory on the cards they already hold, when every one of those
cards has room, else nothing changes; a pending claim only changes what it waits for.

Locks are taken as a delete takes them: the claim's row, then its node's, then its cards'.
The node's desired generation moves, so its agent resizes the vGPUs in the driver (a
shrunk memory limit refuses new allocations past it; memory already allocated stays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.claims import ClaimView, ResizeClaim
from qshare.contracts.domain import MAX_CORE_SHARE, ClaimStatus, Priority, Provisioner
from qshare.contracts.errors import Conflict, FieldError
from qshare.contracts.quantities import format_mib
from qshare.contracts.rows import claim_views, node_is_ready
from qshare.contracts.schema import claims, gpus, nodes, vgpus
from qshare.settings import ClusterSettings
from qshare_allocator.claims.classes import ClassCatalog
from qshare_allocator.claims.quotas import check_growth
from qshare_allocator.claims.transitions import claim_event_params, locked_claim
from qshare_allocator.claims.views import demand_of, spec_of
from qshare_allocator.outbox import event_insert
from qshare_allocator.placement.capacity import adjust_node
from qshare_allocator.placement.demand import check_granularity
from qshare_allocator.placement.diagnosis import why_not

RESIZABLE = (ClaimStatus.PENDING.value, ClaimStatus.PLACED.value, ClaimStatus.READY.value)


@dataclass(frozen=True)
class Size:
    """Core share and memory per card."""

    vcore: int
    vmemory_mib: int


class Resizer:
    def __init__(self, rules: ClusterSettings, source: str) -> None:
        self._rules = rules
        self._source = source
        self._classes = ClassCatalog()

    async def resize(self, conn: AsyncConnection, command: ResizeClaim) -> ClaimView:
        """The claim at its new size, or an error naming what stops it (nothing written)."""
        row = await _locked_claim(conn, command)
        await self._check_class(conn, row)
        old = Size(row.vcore, row.vmemory_mib)
        new = Size(command.change.vcore or old.vcore, command.change.vmemory or old.vmemory_mib)
        check_granularity(new.vmemory_mib, Provisioner.QSHARE, self._rules)
        await check_growth(conn, row.tenant, (new.vmemory_mib - old.vmemory_mib) * _count(row))
        reason = row.reason
        if row.status == ClaimStatus.PENDING.value:
            reason = await self._pending_reason(conn, row, new)
        elif new != old:
            await _resize_on_cards(conn, row, old, new, self._rules.node_timeout_s)
        return await self._record(conn, row, new, reason)

    async def _check_class(self, conn: AsyncConnection, row: Row[Any]) -> None:
        if await self._classes.provisioner(conn, row.class_name) is Provisioner.WHOLE:
            raise Conflict(
                f"claim {row.id} takes whole cards (class {row.class_name}): it has no size "
                "to change"
            )

    async def _pending_reason(self, conn: AsyncConnection, row: Row[Any], new: Size) -> str:
        """What the pending claim waits for at its new size; InvalidInput when no card in the
        cluster could ever hold it (as at create)."""
        spec = spec_of(row).model_copy(update={"vcore": new.vcore, "vmemory": new.vmemory_mib})
        demand = demand_of(spec, Provisioner.QSHARE, self._rules)
        return await why_not(conn, demand, self._rules.node_timeout_s)

    async def _record(
        self, conn: AsyncConnection, row: Row[Any], new: Size, reason: str | None
    ) -> ClaimView:
        changed = await conn.execute(
            update(claims)
            .where(claims.c.id == row.id)
            .values(
                vcore=new.vcore, vmemory_mib=new.vmemory_mib, reason=reason, updated_at=func.now()
            )
            .returning(claims)
        )
        view = (await claim_views(conn, [changed.one()]))[0]
        await conn.execute(event_insert(), claim_event_params(self._source, view, "resized"))
        return view


async def _locked_claim(conn: AsyncConnection, command: ResizeClaim) -> Row[Any]:
    row: Row[Any] = await locked_claim(conn, command.claim_id, command.tenant)
    if row.status not in RESIZABLE:
        raise Conflict(
            f"claim {row.id} is {row.status}: only pending, placed and ready claims are resized"
        )
    return row


async def _resize_on_cards(
    conn: AsyncConnection, row: Row[Any], old: Size, new: Size, node_timeout_s: float
) -> None:
    ready = await _locked_node_ready(conn, row.node_name, node_timeout_s)
    grows = new.vcore > old.vcore or new.vmemory_mib > old.vmemory_mib
    if grows and not ready:
        raise Conflict(
            f"claim {row.id} cannot grow: node {row.node_name} is NotReady, so no agent would "
            "apply it (a shrink is allowed)"
        )
    cards = await _locked_cards(conn, row)
    high = row.priority == Priority.HIGH.value
    problems = [p for card in cards if (p := _no_room(card, high, old, new, grows)) is not None]
    if problems:
        words = "; ".join(p.message for p in problems)
        raise Conflict(f"claim {row.id} cannot be resized where it runs: {words}", problems)
    await _write_sizes(conn, row, high, old, new)


async def _locked_node_ready(conn: AsyncConnection, node: str, node_timeout_s: float) -> bool:
    """Lock the claim's node (as a delete does); whether it is Ready."""
    query = select(node_is_ready()).where(nodes.c.name == node).with_for_update(of=nodes)
    found = await conn.execute(query, {"node_timeout_s": node_timeout_s})
    return bool(found.scalar_one_or_none())


async def _locked_cards(conn: AsyncConnection, row: Row[Any]) -> list[Row[Any]]:
    query = (
        select(gpus)
        .where(gpus.c.uuid.in_(select(vgpus.c.gpu_uuid).where(vgpus.c.claim_id == row.id)))
        .order_by(gpus.c.uuid)
        .with_for_update()
    )
    return list((await conn.execute(query)).all())


def _no_room(card: Row[Any], high: bool, old: Size, new: Size, grows: bool) -> FieldError | None:
    """Why `card` cannot take the claim's vGPU at its new size; None when it can. A card
    that is unhealthy or retired takes no growth (as no placement), only shrinks."""
    if grows and (not card.healthy or card.retired):
        state = "retired (its node no longer reports it)" if card.retired else "unhealthy"
        message = f"card {card.uuid} is {state}: a claim grows only on a healthy card"
        return FieldError(field="vmemory" if new.vmemory_mib > old.vmemory_mib else "vcore",
                          message=message)  # fmt: skip
    free_mib = card.memory_mib - card.allocated_mib + old.vmemory_mib
    if new.vmemory_mib > free_mib:
        message = (
            f"card {card.uuid} has {format_mib(free_mib)} for it, "
            f"{format_mib(new.vmemory_mib)} asked"
        )
        return FieldError(field="vmemory", message=message)
    core_free = MAX_CORE_SHARE - (card.core_high if high else card.core_low) + old.vcore
    if new.vcore > core_free:
        share = f"{core_free}% {'high' if high else 'low'} core share"
        message = f"card {card.uuid} has {share} for it, {new.vcore}% asked"
        return FieldError(field="vcore", message=message)
    return None


async def _write_sizes(
    conn: AsyncConnection, row: Row[Any], high: bool, old: Size, new: Size
) -> None:
    mib, core = new.vmemory_mib - old.vmemory_mib, new.vcore - old.vcore
    held = select(vgpus.c.gpu_uuid).where(vgpus.c.claim_id == row.id)
    await conn.execute(
        update(gpus)
        .where(gpus.c.uuid.in_(held))
        .values(
            allocated_mib=gpus.c.allocated_mib + mib,
            core_high=gpus.c.core_high + (core if high else 0),
            core_low=gpus.c.core_low + (0 if high else core),
        )
    )
    await conn.execute(
        update(vgpus)
        .where(vgpus.c.claim_id == row.id)
        .values(vcore=new.vcore, vmemory_mib=new.vmemory_mib)
    )
    given, share = -mib * _count(row), -core * _count(row)  # what the node gets back
    await adjust_node(conn, row.node_name, given, share if high else 0, 0 if high else share)


def _count(row: Row[Any]) -> int:
    """The claim's card count (`row.count` is the tuple's method)."""
    count: int = row._mapping["count"]
    return count
