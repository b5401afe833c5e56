"""`qshare bench sweep`: what one pending-claim retry of the pending sweep costs when the cluster
is full of evictable low-priority claims, for high-priority claims (each one plans an eviction
that cannot help) against low-priority claims of the same shape (no planning), on one real
Postgres, in-process, one run.

Every card (80 GiB) holds one 30 GiB high-priority claim and two 20 GiB low-priority claims of
the evictable default class; a pending claim asks 60 GiB, more than evicting both would free.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.bench.stats import percentiles
from qshare.contracts.claims import ClaimSpec, CreateClaim
from qshare.contracts.domain import Priority
from qshare.contracts.nodes import GpuSpec, NodeRegistration
from qshare.db import in_transaction
from qshare.settings import ClusterSettings
from qshare.testing.servers import EmbeddedPostgres

SOURCE = "qshare-bench/sweep"
RULES = ClusterSettings(node_timeout_s=86400)
CARD_GIB = 80
HIGH_GIB = 30
LOW_GIB = 20
PENDING_GIB = 60


@dataclass(frozen=True)
class Scale:
    nodes: int
    cards: int
    pending: int
    rounds: int


FULL = Scale(nodes=100, cards=8, pending=200, rounds=5)
QUICK = Scale(nodes=10, cards=8, pending=50, rounds=3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_run(QUICK if args.quick else FULL))


def table(result: dict[str, Any]) -> str:
    lines = [f"{'pending':<8} {'claims':>7} {'p50 ms':>8} {'p99 ms':>8} {'sweep s':>8}"]
    for kind in ("low", "high"):
        r = result[kind]
        lines.append(
            f"{kind:<8} {r['claims']:>7} {r['per_claim_ms']['p50']:>8.2f} "
            f"{r['per_claim_ms']['p99']:>8.2f} {r['sweep_s_median']:>8.2f}"
        )
    lines.append(
        f"high/low per-claim p50 ratio {result['ratio_p50']:.1f}; inventory {result['nodes']} "
        f"nodes × {result['cards_per_node']} cards, {result['low_claims_held']} low-priority "
        f"vGPUs held"
    )
    return "\n".join(lines)


async def _run(scale: Scale) -> dict[str, Any]:
    from qshare_allocator.db import make_engine
    from qshare_allocator.migrate import upgrade

    async with EmbeddedPostgres(durable=False) as pg:
        await upgrade(pg.url)
        engine = make_engine(pg.url, 4)
        try:
            held = await _fill(engine, scale)
            figures = {}
            for priority in (Priority.LOW, Priority.HIGH):
                await _pending(engine, priority, scale.pending)
                figures[priority.value] = await _measure(engine, priority, scale.rounds)
                await _forget_pending(engine)
        finally:
            await engine.dispose()
    ratio = figures["high"]["per_claim_ms"]["p50"] / figures["low"]["per_claim_ms"]["p50"]
    return {"nodes": scale.nodes, "cards_per_node": scale.cards, "low_claims_held": held,
            "ratio_p50": ratio, **figures}  # fmt: skip


async def _fill(engine: AsyncEngine, scale: Scale) -> int:
    from qshare_allocator.inventory.service import InventoryService

    inventory = InventoryService(RULES, SOURCE)
    for n in range(scale.nodes):
        cards = [GpuSpec(uuid=f"GPU-{n}-{c}", index=c, model="A100", memory=f"{CARD_GIB}Gi")
                 for c in range(scale.cards)]  # fmt: skip
        registration = NodeRegistration(name=f"node-{n}", gpus=cards)
        await in_transaction(
            engine, functools.partial(inventory.register, registration=registration)
        )
    total = scale.nodes * scale.cards
    await _create(engine, Priority.HIGH, HIGH_GIB, total)  # one a card: HP spreads from HP
    await _create(engine, Priority.LOW, LOW_GIB, 2 * total)
    return 2 * total


async def _pending(engine: AsyncEngine, priority: Priority, count: int) -> None:
    await _create(engine, priority, PENDING_GIB, count)


async def _create(engine: AsyncEngine, priority: Priority, gib: int, count: int) -> None:
    from qshare_allocator.claims.service import ClaimService

    service = ClaimService(RULES, SOURCE)
    spec = ClaimSpec(priority=priority, vcore=10, vmemory=gib * 1024)
    command = CreateClaim(tenant="admin", spec=spec)
    for _ in range(count):
        await in_transaction(engine, functools.partial(service.create, command=command))


async def _measure(engine: AsyncEngine, priority: Priority, rounds: int) -> dict[str, Any]:
    """`rounds` sweeps of the pending claims of `priority`, as the allocator's sweep does
    them (one transaction each, oldest first); each claim's retry timed."""
    from qshare_allocator.claims.service import ClaimService

    service = ClaimService(RULES, SOURCE)
    samples: list[float] = []
    sweeps: list[float] = []
    for _ in range(rounds):
        cursor: Any = None
        began = time.perf_counter()
        while True:
            start = time.perf_counter()
            place = functools.partial(service.place_pending, after=cursor, priority=priority)
            tried = await in_transaction(engine, place)
            if tried is None:
                break
            cursor = tried.cursor
            samples.append((time.perf_counter() - start) * 1000)
        sweeps.append(time.perf_counter() - began)
    return {"claims": len(samples) // rounds, "per_claim_ms": percentiles(samples, (50, 99)),
            "sweep_s_median": statistics.median(sweeps)}  # fmt: skip


async def _forget_pending(engine: AsyncEngine) -> None:
    from sqlalchemy import delete

    from qshare.contracts.schema import claims

    async with engine.begin() as conn:
        await conn.execute(delete(claims).where(claims.c.status == "pending"))
