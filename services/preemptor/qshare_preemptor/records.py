"""Preemption records in Postgres: opened when the control plane suspends a claim, closed
when it resumes it; `GET /v1/preemptions` reads them. A `gang` record also names the busy
cards holding its claim (`busy_gpus`), from which a restarted preemptor rebuilds its state.
The allocator's applies carry what the records hold suspended to the nodes (`renew_nodes`)."""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy import ARRAY, ColumnElement, Text, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.schema import nodes, preemptions
from qshare_preemptor.gangs import Member, known_cards, vgpus_of_claims

OPEN_GANG = (preemptions.c.kind == "gang", preemptions.c.ended_at.is_(None))


async def open_records(
    conn: AsyncConnection, members: list[Member], kind: str, reason: str, by: str | None = None
) -> None:
    """One open record per claim among `members` that has none of this kind yet, naming
    the token `by` that asked (an operator's)."""
    claims = {m.claim_id: m for m in members}
    already = await open_claims(conn, list(claims), kind)
    fresh = [m for c, m in claims.items() if c not in already]
    await _insert(conn, fresh, kind, reason, None, by)


async def hold_records(conn: AsyncConnection, members: list[Member], reason: str, gpu: str) -> None:
    """Busy card `gpu` holds the claims among `members`: it joins the busy cards of each one's
    open gang record, or opens one naming it (two statements: they run on the path from a
    busy card to its gangs being suspended)."""
    claims = {m.claim_id: m for m in members}
    joined = await conn.execute(
        update(preemptions)
        .where(*OPEN_GANG, preemptions.c.claim_id.in_(list(claims)), ~_released())
        .values(busy_gpus=_with(gpu))
        .returning(preemptions.c.claim_id)
    )
    already = set(joined.scalars().all())
    await _insert(conn, [m for c, m in claims.items() if c not in already], "gang", reason, gpu)


async def leave_records(conn: AsyncConnection, claim_ids: list[uuid.UUID], gpu: str) -> None:
    """Card `gpu`, now idle, no longer holds the claims `claim_ids` (others still do)."""
    await conn.execute(
        update(preemptions)
        .where(*OPEN_GANG, preemptions.c.claim_id.in_(claim_ids))
        .values(busy_gpus=func.array_remove(preemptions.c.busy_gpus, gpu, type_=ARRAY(Text)))
    )


async def release_records(conn: AsyncConnection, claim_ids: list[uuid.UUID]) -> None:
    """No busy card holds the claims `claim_ids` any more, and their resumes are on their
    way: their gang records name no card (`busy_gpus` empty) until `close_released`."""
    await conn.execute(
        update(preemptions)
        .where(*OPEN_GANG, preemptions.c.claim_id.in_(claim_ids))
        .values(busy_gpus=[])
    )


async def close_released(conn: AsyncConnection, claim_ids: list[uuid.UUID]) -> None:
    """End the gang records of `claim_ids` that no busy card joined since their release."""
    await conn.execute(
        update(preemptions)
        .where(*OPEN_GANG, preemptions.c.claim_id.in_(claim_ids), _released())
        .values(ended_at=func.now())
    )


async def close_records(
    conn: AsyncConnection, claim_ids: list[uuid.UUID], kind: str, by: str | None = None
) -> None:
    """End the open records of `kind` of `claim_ids`, naming the token `by` that asked."""
    await conn.execute(
        update(preemptions)
        .where(
            preemptions.c.claim_id.in_(claim_ids),
            preemptions.c.kind == kind,
            preemptions.c.ended_at.is_(None),
        )
        .values(ended_at=func.now(), resumed_by=by)
    )


async def open_claims(
    conn: AsyncConnection, claim_ids: list[uuid.UUID], kind: str | None = None
) -> set[uuid.UUID]:
    """Claims among `claim_ids` with an open record (of `kind`, or of any kind)."""
    query = select(preemptions.c.claim_id).where(
        preemptions.c.claim_id.in_(claim_ids), preemptions.c.ended_at.is_(None)
    )
    if kind is not None:
        query = query.where(preemptions.c.kind == kind)
    return set((await conn.execute(query)).scalars().all())


async def open_gangs(conn: AsyncConnection) -> dict[uuid.UUID, tuple[set[str], list[Member]]]:
    """Each claim with an open `gang` record (one an operator holds too: its record must end
    as well): the busy cards its record names that are still in the inventory (none: it
    names none) and the claim's vGPUs."""
    query = select(preemptions.c.claim_id, preemptions.c.gpu_uuid, preemptions.c.busy_gpus).where(
        *OPEN_GANG
    )
    named: dict[uuid.UUID, set[str]] = defaultdict(set)
    for claim_id, first, busy in (await conn.execute(query)).all():
        named[claim_id].update(busy if busy is not None else [first] if first else [])
    if not named:
        return {}
    known = await known_cards(conn, set().union(*named.values()))
    members: dict[uuid.UUID, list[Member]] = defaultdict(list)
    for member in await vgpus_of_claims(conn, list(named)):
        members[member.claim_id].append(member)
    return {c: (cards & known, members[c]) for c, cards in named.items()}


async def renew_nodes(conn: AsyncConnection, names: set[str]) -> None:
    """Give the nodes `names` a new desired generation, after a change of the records of
    claims with vGPUs there: the allocator's scan then sends each an apply read after the
    change, carrying each vGPU's `suspended` flag. A node's agent may have taken an apply
    read before the change after the preemptor's command (or a command may have found a
    vGPU an apply had not created yet, just after a reboot); the later apply sets it right.
    The rows are locked in name order, so two renewals never wait on each other in a cycle."""
    if not names:
        return
    locked = (
        select(nodes.c.name)
        .where(nodes.c.name.in_(sorted(names)))
        .order_by(nodes.c.name)
        .with_for_update()
    )
    await conn.execute(
        update(nodes)
        .where(nodes.c.name.in_(locked.scalar_subquery()))
        .values(desired_generation=nodes.c.desired_generation + 1)
    )


def _released() -> ColumnElement[bool]:
    """A gang record released, its resumes not all confirmed yet: it names no busy card (a
    new busy card opens a record of its own rather than joining it)."""
    return func.coalesce(func.cardinality(preemptions.c.busy_gpus), -1) == 0


def _with(gpu: str) -> ColumnElement[list[str]]:
    """The record's busy cards with `gpu` among them (once)."""
    kept = func.array_remove(preemptions.c.busy_gpus, gpu, type_=ARRAY(Text))
    return func.array_append(kept, gpu, type_=ARRAY(Text))


async def _insert(
    conn: AsyncConnection,
    members: list[Member],
    kind: str,
    reason: str,
    gpu: str | None,
    by: str | None = None,
) -> None:
    if not members:
        return
    busy = [gpu] if kind == "gang" and gpu is not None else None
    rows = [
        {"claim_id": m.claim_id, "tenant": m.tenant, "gpu_uuid": gpu, "node_name": m.node,
         "kind": kind, "reason": reason, "busy_gpus": busy, "suspended_by": by}
        for m in members
    ]  # fmt: skip
    await conn.execute(insert(preemptions), rows)
