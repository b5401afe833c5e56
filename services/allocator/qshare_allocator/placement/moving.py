"""Moving a starved low-priority claim, at the preemptor's request, to a card with more
harvestable time: the claim's vGPU is given back on its card and created on the first of
the named cards where it fits (healthy, Ready node, room, selector), in one transaction.
The claim goes `placed` (event `moved`) and `ready` once the new node confirms; the old
node removes the vGPU at its next apply. Never a high-priority claim, never a multi-card
claim, only where the claim's class allows it (`move_on_starvation`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from opentelemetry.trace import Span
from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import HOLDING_STATUSES, MAX_CORE_SHARE, ClaimStatus, Priority
from qshare.contracts.errors import InvalidInput, NotFound
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import claims, classes, gpus, nodes, vgpus
from qshare.contracts.tracing import later_span, span_context, stored_context
from qshare.contracts.usage import MoveClaim, MoveReply
from qshare.settings import ClusterSettings
from qshare_allocator.claims.classes import ClassCatalog
from qshare_allocator.claims.transitions import transition
from qshare_allocator.claims.views import demand_of, spec_of
from qshare_allocator.db import together
from qshare_allocator.placement.capacity import give_back, holding
from qshare_allocator.placement.demand import Demand
from qshare_allocator.placement.finder import Card, Choice


class Mover:
    def __init__(self, rules: ClusterSettings, source: str) -> None:
        self._rules = rules
        self._source = source
        self._classes = ClassCatalog()

    async def move(self, conn: AsyncConnection, command: MoveClaim) -> MoveReply:
        row = await _locked_claim(conn, command)
        held = list((await conn.execute(select(vgpus).where(vgpus.c.claim_id == row.id))).all())
        if refusal := _refusal(row, held, command):
            return MoveReply(claim_id=row.id, reason=refusal)
        provisioner = await self._classes.provisioner(conn, row.class_name)
        demand = demand_of(spec_of(row), provisioner, self._rules)
        if demand.whole:
            return MoveReply(claim_id=row.id, reason="whole-card claims are not moved")
        targets = [g for g in dict.fromkeys(command.to_gpus) if g != command.from_gpu]
        locked = await _lock_nodes(conn, row.node_name, targets)
        for gpu in targets:
            if card := await self._target(conn, locked, gpu, demand):
                with _linked_to_creator(row, card.node_name):
                    return await self._move(conn, row, demand, card, command)
        return MoveReply(claim_id=row.id, reason="no better card has room for it")

    async def _target(
        self, conn: AsyncConnection, locked: list[str], gpu: str, demand: Demand
    ) -> Any:
        """The card `gpu` if the claim fits there (its node among the `locked`)."""
        params = {"node_timeout_s": self._rules.node_timeout_s, "selector": demand.selector}
        return (await conn.execute(_fitting(gpu, locked, demand), params)).one_or_none()

    async def _move(
        self, conn: AsyncConnection, row: Any, demand: Demand, card: Any, command: MoveClaim
    ) -> MoveReply:
        await give_back(conn, row.id, row.node_name)
        held = holding(
            row.id, demand, Choice(card.node_name, [Card(card.uuid, card.idx, card.memory_mib)])
        )
        await conn.execute(together(*held.statements), held.params)
        reason = f"moved from card {command.from_gpu} ({command.reason})"
        await transition(
            conn,
            self._source,
            row,
            ClaimStatus.PLACED,
            reason[:253],
            kind="moved",
            node_name=card.node_name,
        )
        return MoveReply(
            claim_id=row.id,
            moved_to=card.uuid,
            from_node=row.node_name,
            to_node=card.node_name,
            reason=reason,
        )


def _linked_to_creator(row: Any, node: str) -> AbstractContextManager[Span]:
    """The move's span: within the preemptor's request that asked for it, linked to the
    trace of the request that created the claim (a move acts for two requests)."""
    creator = span_context(stored_context(row.trace_context, f"claim {row.id}"))
    attributes = {"qshare.claim.id": str(row.id), "qshare.node": node, "qshare.placed_by": "move"}
    links = [creator] if creator is not None else []
    return later_span("qshare.allocator", "claim.move", None, links=links, attributes=attributes)


async def _locked_claim(conn: AsyncConnection, command: MoveClaim) -> Any:
    query = (
        select(claims, classes.c.move_on_starvation)
        .join(classes, classes.c.name == claims.c.class_name)
        .where(claims.c.id == command.claim_id)
        .with_for_update(of=claims)
    )
    row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise NotFound(f"claim {command.claim_id} not found")
    if row.priority != Priority.LOW.value:
        raise InvalidInput.on("claim_id", "a high-priority claim is never moved")
    return row


async def _lock_nodes(conn: AsyncConnection, old_node: str, targets: list[str]) -> list[str]:
    """Lock the claim's node and every target card's node at once, in name order, so two
    moves never each hold a node the other waits for; returns their names. (Locked target by
    target, in preference order, one could hold c and wait for b while another held b and
    waited for c.)"""
    of_targets = select(gpus.c.node_name).where(gpus.c.uuid.in_(targets))
    query = (
        select(nodes.c.name)
        .where(or_(nodes.c.name == old_node, nodes.c.name.in_(of_targets)))
        .order_by(nodes.c.name)
        .with_for_update(of=nodes)
    )
    return list((await conn.execute(query)).scalars().all())


def _refusal(row: Any, held: list[Any], command: MoveClaim) -> str | None:
    if not row.move_on_starvation:
        return f"class {row.class_name} does not allow moving (move_on_starvation is false)"
    if row.status not in HOLDING_STATUSES:
        return f"claim is {row.status}, not holding a card"
    if row.evict_at is not None:
        return "claim is being evicted"
    if len(held) != 1:
        return "only single-card claims are moved"
    if held[0].gpu_uuid != command.from_gpu:
        return f"claim is no longer on card {command.from_gpu}"
    return None


def _fitting(gpu: str, locked: list[str], demand: Demand) -> Any:
    card_ok = and_(
        gpus.c.uuid == gpu,
        gpus.c.node_name.in_(locked),
        gpus.c.healthy,
        gpus.c.retired.is_(False),
        gpus.c.memory_mib - gpus.c.allocated_mib >= demand.vmemory_mib,
        gpus.c.core_low <= MAX_CORE_SHARE - demand.vcore,
        gpus.c.vgpu_count < gpus.c.max_vgpus,
    )
    node_ok = and_(
        nodes.c.schedulable,
        node_is_ready(),
        nodes.c.labels.contains(bindparam("selector", type_=JSONB)),
    )
    return (
        select(gpus.c.uuid, gpus.c.idx, gpus.c.memory_mib, gpus.c.node_name)
        .join(nodes, nodes.c.name == gpus.c.node_name)
        .where(card_ok, node_ok)
        .with_for_update(of=gpus)
    )
