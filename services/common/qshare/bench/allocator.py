"""`qshare bench allocator`: placement throughput and latency through NATS (2 allocator replicas,
32 concurrent requesters) and through the REST API, on real Postgres and NATS servers.

The inventory is 1,000 nodes × 8 cards (80 GiB each); the NATS run creates 5,000 claims, the
REST run 1,000. `overcommitted_cards` and `double_placements` are counted by SQL over the final
state. Postgres keeps its durable defaults (fsync and synchronous_commit on); autovacuum
wakes every second (`autovacuum_naptime = 1`) so the hot tables stay small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from nats.aio.client import Client
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.bus import connect, options_for
from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.nodes import NodeRegistration, NodeView
from qshare.natsauth import NatsAuth, ServiceRole, identity_env
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, ServiceProcess, free_port
from qshare_allocator.audit import double_placements, overcommitted_cards

REQUESTERS = 32
Create = Callable[[int], Awaitable[bool]]
REPLICAS = 2
ADMIN_TOKEN = "qs_bench_admin"


@dataclass(frozen=True)
class Scale:
    nodes: int
    cards: int
    nats_claims: int
    rest_claims: int
    open_claims: int


FULL = Scale(nodes=1000, cards=8, nats_claims=5000, rest_claims=1000, open_claims=2000)
QUICK = Scale(nodes=50, cards=8, nats_claims=500, rest_claims=100, open_claims=100)
OPEN_LOOP_LOAD = 0.6
"""Open-loop arrivals at this fraction of the closed-loop capacity just measured."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_run(QUICK if args.quick else FULL))


def table(result: dict[str, Any]) -> str:
    lines = [f"{'path':<6} {'claims':>7} {'placed/s':>9} {'p50 ms':>8} {'p99 ms':>8}"]
    for path in ("nats", "rest"):
        r = result[path]
        lines.append(
            f"{path:<6} {r['claims']:>7} {r['placements_per_s']:>9.0f} "
            f"{r['latency_ms']['p50']:>8.1f} {r['latency_ms']['p99']:>8.1f}"
        )
    ol = result["open_loop"]
    lines.append(
        f"open loop: {ol['claims']} claims, Poisson at {ol['offered_per_s']:.0f}/s "
        f"(60 % of closed-loop capacity): p50 {ol['latency_ms']['p50']:.1f} ms, "
        f"p99 {ol['latency_ms']['p99']:.1f} ms (target p99 <= 50 ms)"
    )
    lines.append(
        f"inventory {result['nodes']} nodes × {result['cards_per_node']} cards; "
        f"overcommitted cards {result['overcommitted_cards']}, "
        f"double placements {result['double_placements']}"
    )
    return "\n".join(lines)


async def _run(scale: Scale) -> dict[str, Any]:
    async with _stack() as (database_url, nc, api_url):
        await _register_inventory(nc, scale)
        over_nats = functools.partial(_create_over_nats, nc)
        nats_figures = await _measure(scale.nats_claims, [over_nats] * REQUESTERS)
        rate = OPEN_LOOP_LOAD * nats_figures["placements_per_s"]
        open_loop = await _open_loop(over_nats, rate, scale.open_claims, first=2_000_000)
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(_http(api_url)) for _ in range(REQUESTERS)]
            over_rest = [functools.partial(_create_over_rest, client) for client in clients]
            rest_figures = await _measure(scale.rest_claims, over_rest)
        overcommitted, double = await _audit(database_url)
    return {
        "nodes": scale.nodes,
        "cards_per_node": scale.cards,
        "requesters": REQUESTERS,
        "allocator_replicas": REPLICAS,
        "nats": nats_figures,
        "rest": rest_figures,
        "open_loop": open_loop,
        "overcommitted_cards": overcommitted,
        "double_placements": double,
    }


@contextlib.asynccontextmanager
async def _stack() -> AsyncIterator[tuple[str, Client, str]]:
    """Postgres, NATS, two allocator processes and one API process."""
    from qshare_allocator.migrate import upgrade

    settings = {"max_connections": "200", "autovacuum_naptime": "1"}  # see migration 0002
    identities = NatsAuth.generate()
    async with (
        EmbeddedPostgres(durable=True, settings=settings) as pg,
        EmbeddedNats(config=identities.server_config()) as bus,
    ):
        await upgrade(pg.url)
        common = {"QSHARE_NODE_TIMEOUT_S": "86400"}
        allocator_env = (
            common
            | {
                "QSHARE_ALLOCATOR_DATABASE_URL": pg.url,
                "QSHARE_ALLOCATOR_NATS_URL": bus.url,
            }
            | identity_env("QSHARE_ALLOCATOR_", identities.credentials(ServiceRole.ALLOCATOR))
        )
        port = free_port()
        api_env = common | {
            "QSHARE_API_DATABASE_URL": pg.url, "QSHARE_API_NATS_URL": bus.url,
            "QSHARE_API_PORT": str(port), "QSHARE_API_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN,
            "QSHARE_API_POOL_SIZE": str(REQUESTERS), "QSHARE_API_RATE_LIMIT_PER_S": "1e9",
            "QSHARE_API_RATE_LIMIT_BURST": "1000000000",
        } | identity_env("QSHARE_API_", identities.credentials(ServiceRole.API))  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            for i in range(REPLICAS):
                env = allocator_env | {"QSHARE_ALLOCATOR_INSTANCE": f"bench-{i}"}
                await stack.enter_async_context(ServiceProcess("qshare_allocator", env, "serving"))
            await stack.enter_async_context(
                ServiceProcess("qshare_api", api_env, "startup complete")
            )
            operator = identities.credentials(ServiceRole.OPERATOR)
            nc = await connect(options_for(bus.url, "bench", operator))
            try:
                yield pg.url, nc, f"http://127.0.0.1:{port}"
            finally:
                await nc.close()


def _http(url: str) -> httpx.AsyncClient:
    """One client (one keep-alive connection) per requester: a shared pool costs the client
    more CPU than the server spends on the request."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.AsyncClient(base_url=url, headers=headers, limits=httpx.Limits(max_connections=1))


async def _register_inventory(nc: Client, scale: Scale) -> None:
    async def one(n: int) -> None:
        gpus = [
            {"uuid": f"GPU-{n:04d}-{i}", "index": i, "model": "A100-80GB", "memory": "80Gi"}
            for i in range(scale.cards)
        ]
        registration = NodeRegistration.model_validate(
            {"name": f"node-{n:04d}", "labels": {"zone": f"z{n % 4}"}, "gpus": gpus}
        )
        await rpc.call(nc, subjects.NODES_REGISTER, "bench", registration, NodeView, timeout=30)

    await _pool(scale.nodes, [one] * REQUESTERS)


def _spec(i: int) -> dict[str, Any]:
    """A reproducible mix: both priorities, shares 10–50 %, 1–8 GiB, one card in ten wants two."""
    rng = random.Random(i)
    return {
        "priority": "high" if i % 2 else "low",
        "vcore": rng.choice([10, 20, 25, 30, 50]),
        "vmemory": rng.choice(["1Gi", "2Gi", "4Gi", "8Gi"]),
        "count": 2 if i % 10 == 0 else 1,
    }


async def _create_over_nats(nc: Client, i: int) -> bool:
    command = CreateClaim(tenant=f"tenant-{i % 8}", spec=ClaimSpec.model_validate(_spec(i)))
    reply = await rpc.call(
        nc, subjects.CLAIMS_CREATE, "bench", command, CreateClaimReply, timeout=30
    )
    return reply.claim.status == "placed"


async def _create_over_rest(http: httpx.AsyncClient, i: int) -> bool:
    response = await http.post("/v1/claims", json=_spec(i + 1_000_000), timeout=30)
    response.raise_for_status()
    return bool(response.json()["status"] == "placed")


async def _measure(claims: int, requesters: Sequence[Create]) -> dict[str, Any]:
    """`claims` creations by closed-loop requesters (each sends its next when answered)."""
    latencies: list[float] = []
    placed = 0

    def timed(create: Create) -> Callable[[int], Awaitable[None]]:
        async def one(i: int) -> None:
            nonlocal placed
            started = time.perf_counter()
            ok = await create(i)
            placed += ok
            latencies.append(time.perf_counter() - started)

        return one

    started = time.perf_counter()
    await _pool(claims, [timed(create) for create in requesters])
    elapsed = time.perf_counter() - started
    return {
        "claims": claims,
        "placed": placed,
        "seconds": round(elapsed, 3),
        "placements_per_s": round(placed / elapsed, 1),
        "latency_ms": {"p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99)},
    }


async def _open_loop(create: Create, rate: float, claims: int, first: int) -> dict[str, Any]:
    """`claims` creations arriving as a Poisson process at `rate` per second, each timed from
    its arrival (not from when a requester was free): latency under a load the system can carry."""
    latencies: list[float] = []
    rng = random.Random(11)

    async def one(i: int) -> None:
        started = time.perf_counter()
        await create(i)
        latencies.append(time.perf_counter() - started)

    tasks = []
    for i in range(claims):
        tasks.append(asyncio.create_task(one(first + i)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return {
        "claims": claims,
        "offered_per_s": round(rate, 1),
        "latency_ms": {"p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99)},
    }


async def _pool(total: int, workers: Sequence[Callable[[int], Awaitable[None]]]) -> None:
    """Items 0..total-1 shared by the workers, each taking the next when it is done."""
    items = iter(range(total))

    async def run(work: Callable[[int], Awaitable[None]]) -> None:
        for i in items:
            await work(i)

    await asyncio.gather(*(run(work) for work in workers))


def _percentile(samples: list[float], q: int) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return round(ordered[index] * 1000, 2)


async def _audit(database_url: str) -> tuple[int, int]:
    engine = create_async_engine(database_url)
    async with engine.connect() as conn:
        overcommitted = await overcommitted_cards(conn)
        double = await double_placements(conn)
    await engine.dispose()
    return overcommitted, double
