"""`qshare bench cluster`: the cluster loop end to end on this machine — 100 simulated nodes ×
4 cards (node agents sharing this process, each with its own driver segment and NATS
connection), one allocator, the preemptor, embedded durable Postgres and NATS.

- claim → ready: claims offered open loop (Poisson) at a fixed rate over NATS; latency from
  the request to the `ready` event reaching a subscriber. The first `warmup` claims, offered
  the same way, are not measured: they open the services' database connections and fill
  their statement caches, which a running cluster has long done.
- HP co-location: after the load (LP and HP claims interleaved), the share of HP vGPUs on a
  card that also holds LP work.
- driver event → subscriber: a high-priority launch on a simulated card; from the driver's
  event time (CLOCK_MONOTONIC) to its arrival at a NATS subscriber.
- gang suspension: an LP claim of two cards beside an HP claim; from the HP launch until the
  preemptor reports the gang suspended on its other card (`suspended` claim event).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.bench.stats import percentiles
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.domain import NODE_LABEL
from qshare.service import settle_heap
from qshare.settings import ClusterSettings
from qshare.stack import Stack, StackOptions, running_stack

QS = (50, 99)


@dataclass(frozen=True)
class Scale:
    nodes: int
    cards: int
    rate_per_s: float
    claims: int
    events: int
    gangs: int
    warmup: int


FULL = Scale(nodes=100, cards=4, rate_per_s=50.0, claims=1000, events=200, gangs=40, warmup=50)
QUICK = Scale(nodes=10, cards=4, rate_per_s=20.0, claims=100, events=30, gangs=8, warmup=5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    durable = not getattr(args, "volatile_postgres", False)
    return asyncio.run(_run(QUICK if args.quick else FULL, durable))


def table(r: dict[str, Any]) -> str:
    rows = [
        ("claim -> ready", r["claim_to_ready_ms"], "p99 <= 250 ms"),
        ("driver event -> subscriber", r["event_to_subscriber_ms"], "p99 <= 5 ms"),
        ("busy -> LP gang suspended", r["gang_suspend_ms"], "p99 <= 20 ms"),
    ]
    lines = [f"{'path':<28} {'p50 ms':>8} {'p99 ms':>8}  target"]
    lines += [f"{n:<28} {v['p50']:>8.2f} {v['p99']:>8.2f}  {t}" for n, v, t in rows]
    lines.append(
        f"{r['claims_ready']} of {r['claims_created']} claims ready at "
        f"{r['offered_per_s']:g}/s offered on {r['nodes']} nodes x {r['cards_per_node']} cards "
        f"(Postgres {r.get('postgres', 'durable')}); "
        f"HP beside LP: {100 * r['hp_colocated_share']:.1f} % (target >= 95 %)"
    )
    return "\n".join(lines)


async def _run(scale: Scale, durable: bool) -> dict[str, Any]:
    options = StackOptions(
        nodes=scale.nodes, cards=scale.cards, card_memory="16Gi", durable=durable,
        shm_dir=Path(tempfile.mkdtemp(prefix="qshare-bench-")), release_delay_s=0.002,
        heartbeat_s=5.0, node_prefix="bench", service_processes=True,
        rules=ClusterSettings(node_timeout_s=60, node_policy="spread", card_policy="spread"),
    )  # fmt: skip
    async with running_stack(options) as stack:
        settle_heap()
        nc = await stack.connect("qshare-bench")
        try:
            await _claims_open_loop(nc, scale.rate_per_s, scale.warmup, seed=3)
            load = await _claims_open_loop(nc, scale.rate_per_s, scale.claims, seed=7)
            share = await _hp_colocated_share(stack.database_url)
            events = await _event_latency(nc, stack, scale.events)
            gangs = await _gang_suspension(nc, stack, scale.gangs)
        finally:
            await nc.close()
    return {
        "nodes": scale.nodes, "cards_per_node": scale.cards, "offered_per_s": scale.rate_per_s,
        "postgres": "durable" if durable else "volatile (no fsync)",
        "warmup_claims": scale.warmup,
        **load, "hp_colocated_share": share,
        "event_to_subscriber_ms": percentiles(events, QS), "events_measured": len(events),
        "gang_suspend_ms": percentiles([g for g in gangs if g != math.inf], QS),
        "gangs_measured": len(gangs), "gangs_never_suspended": gangs.count(math.inf),
    }  # fmt: skip


async def _claims_open_loop(nc: Client, rate_per_s: float, count: int, seed: int) -> dict[str, Any]:
    ready_at: dict[str, float] = {}

    async def on_ready(msg: Msg) -> None:
        ready_at[msg.subject.split(".")[3]] = time.perf_counter()

    sub = await nc.subscribe("qshare.evt.claim.*.ready", cb=on_ready)
    await nc.flush()
    sent: dict[str, float] = {}
    tasks = []
    rng = random.Random(seed)
    for i in range(count):
        tasks.append(asyncio.create_task(_create(nc, i, sent)))
        await asyncio.sleep(rng.expovariate(rate_per_s))
    await asyncio.gather(*tasks)
    async with asyncio.timeout(60):
        while len(ready_at) < len(sent):
            await asyncio.sleep(0.1)
    await sub.unsubscribe()
    latencies = [(ready_at[c] - t) * 1000 for c, t in sent.items() if c in ready_at]
    return {"claims_created": len(sent), "claims_ready": len(latencies),
            "claim_to_ready_ms": percentiles(latencies, QS)}  # fmt: skip


async def _create(nc: Client, i: int, sent: dict[str, float]) -> None:
    priority = "high" if i % 2 else "low"
    spec = ClaimSpec.model_validate({"priority": priority, "vcore": 10, "vmemory": "1Gi"})
    started = time.perf_counter()
    command = CreateClaim(tenant="bench", spec=spec)
    reply = await rpc.call(nc, subjects.CLAIMS_CREATE, "bench", command, CreateClaimReply, 30)
    sent[str(reply.claim.id)] = started


async def _hp_colocated_share(database_url: str) -> float:
    query = text(
        "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM vgpus l WHERE l.gpu_uuid = h.gpu_uuid"
        " AND l.priority = 'low')) :: float / greatest(count(*), 1) FROM vgpus h"
        " WHERE h.priority = 'high'"
    )
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            return round(float((await conn.execute(query)).scalar_one()), 4)
    finally:
        await engine.dispose()


async def _event_latency(nc: Client, stack: Stack, count: int) -> list[float]:
    """HP launches on cards of HP claims placed by the load; each busy event timed."""
    from qshare_driver import Client as DriverClient
    from qshare_driver.client import now_ns

    arrivals: asyncio.Queue[float] = asyncio.Queue()

    async def on_busy(msg: Msg) -> None:
        got = now_ns()
        sent = envelope.decode(msg.data).data or {}
        await arrivals.put((got - int(sent["time_ns"])) / 1e6)

    sub = await nc.subscribe("qshare.evt.gpu.*.*.busy", cb=on_busy)
    await nc.flush()
    found: list[float] = []
    for agent, local_id in _hp_vgpus(stack)[:count]:
        with DriverClient.attach(
            agent.settings.segment_name, local_id, agent.settings.shm_dir
        ) as c:
            c.launch_begin()
            found.append(await asyncio.wait_for(arrivals.get(), 10))
            c.launch_end()
        await asyncio.sleep(0.01)
    await sub.unsubscribe()
    return found


def _hp_vgpus(stack: Stack) -> list[tuple[Any, int]]:
    """(agent, vGPU id) of one HP vGPU per card, cards in node order."""
    chosen: list[tuple[Any, int]] = []
    for agent in stack.agents:
        seen: set[str] = set()
        for local_id, vgpu in agent.applied.items():
            if vgpu.priority.value == "high" and vgpu.gpu not in seen:
                seen.add(vgpu.gpu)
                chosen.append((agent, local_id))
    return chosen


async def _gang_suspension(nc: Client, stack: Stack, gangs: int) -> list[float]:
    from qshare_driver import Client as DriverClient

    suspended: dict[str, asyncio.Event] = {}

    async def on_suspended(msg: Msg) -> None:
        claim = msg.subject.split(".")[3]
        if claim in suspended:
            suspended[claim].set()

    sub = await nc.subscribe("qshare.evt.claim.*.suspended", cb=on_suspended)
    await nc.flush()
    found: list[float] = []
    for i in range(gangs):
        agent, hp_id, gang_id = await _gang_beside_hp(nc, stack, i)
        suspended[gang_id] = asyncio.Event()
        with DriverClient.attach(agent.settings.segment_name, hp_id, agent.settings.shm_dir) as c:
            started = time.perf_counter()
            c.launch_begin()
            try:
                await asyncio.wait_for(suspended[gang_id].wait(), 10)
                found.append((time.perf_counter() - started) * 1000)
            except TimeoutError:
                found.append(math.inf)  # counted: a gang never reported suspended
            c.launch_end()
        await asyncio.sleep(0.05)
    await sub.unsubscribe()
    return found


async def _gang_beside_hp(nc: Client, stack: Stack, i: int) -> tuple[Any, int, str]:
    """An LP gang of 2 cards and an HP claim beside it on one node, both applied there."""
    agent = stack.agents[i % len(stack.agents)]
    here = {NODE_LABEL: agent.name}
    gang = {"priority": "low", "vcore": 5, "vmemory": "1Gi", "count": 2, "gang": f"g{i}"}
    gang_id, _ = await _applied_claim(nc, gang | {"node_selector": here}, agent)
    hp = {"priority": "high", "vcore": 5, "vmemory": "1Gi", "node_selector": here}
    _, hp_ids = await _applied_claim(nc, hp, agent)
    return agent, hp_ids[0], gang_id


async def _applied_claim(nc: Client, spec: dict[str, Any], agent: Any) -> tuple[str, list[int]]:
    """Create a claim and wait until `agent` holds all its vGPUs: (claim id, vGPU ids)."""
    command = CreateClaim(tenant="bench", spec=ClaimSpec.model_validate(spec))
    reply = await rpc.call(nc, subjects.CLAIMS_CREATE, "bench", command, CreateClaimReply, 30)
    held = agent.applied
    count = spec.get("count", 1)
    async with asyncio.timeout(30):
        while len(ids := [k for k, d in held.items() if d.claim_id == reply.claim.id]) < count:
            await asyncio.sleep(0.02)
    return str(reply.claim.id), ids
