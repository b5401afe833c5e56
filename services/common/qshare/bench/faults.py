"""`qshare bench faults`: creates and deletes through the REST API under load while an
allocator replica is killed, Postgres restarts and NATS stops for `--nats-outage-s`.

Per fault: requests answered, 5xx other than 503 (`http_5xx`, target 0: an outage answers
503), 503s, and `recovered_s`, the seconds from the fault's end (replica killed, server
back) to the first create that succeeds. At the end: outbox rows left (`events_stuck`),
claim events missing from the JetStream stream (`events_lost`), and invariant violations
(over-committed cards, claims placed twice or partly, counters that disagree with vGPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from nats.errors import TimeoutError as NatsTimeout
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare.bus import close, connect, options_for
from qshare.natsauth import NatsAuth, ServiceRole, identity_env
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, ServiceProcess, free_port

ADMIN_TOKEN = "qs_bench_faults_admin"
WORKERS = 8
SETTLE_S = 3.0
"""Load before and after each fault."""

COUNTERS_DISAGREE = text("""
SELECT count(*) FROM gpus g LEFT JOIN (
  SELECT gpu_uuid, sum(vmemory_mib) AS mib, count(*) AS n FROM vgpus GROUP BY gpu_uuid
) v ON v.gpu_uuid = g.uuid
WHERE g.allocated_mib <> coalesce(v.mib, 0) OR g.vgpu_count <> coalesce(v.n, 0)
""")


@dataclass
class Window:
    """What the load saw while one fault lasted."""

    answered: int = 0
    unanswered: int = 0
    http_5xx: int = 0
    http_503: int = 0
    first_success_after_s: float | None = None
    restored_at: float | None = None


@dataclass
class Load:
    windows: dict[str, Window] = field(default_factory=dict)
    current: str = "warmup"
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    stop: bool = False

    def window(self) -> Window:
        return self.windows.setdefault(self.current, Window())

    def saw(self, status: int, is_create: bool) -> None:
        win = self.window()
        win.answered += 1
        win.http_503 += status == 503
        win.http_5xx += status >= 500 and status != 503
        first = win.restored_at is not None and win.first_success_after_s is None
        if is_create and status in (200, 201) and first and win.restored_at is not None:
            win.first_success_after_s = time.monotonic() - win.restored_at


def run(args: argparse.Namespace) -> dict[str, Any]:
    outage = getattr(args, "nats_outage_s", None) or (10.0 if args.quick else 180.0)
    return asyncio.run(_run(outage))


def table(result: dict[str, Any]) -> str:
    lines = [f"{'fault':<18} {'answered':>9} {'5xx':>5} {'503':>6} {'recovered s':>12}"]
    for name, f in result["faults"].items():
        recovered = "-" if f["recovered_s"] is None else f"{f['recovered_s']:.2f}"
        lines.append(
            f"{name:<18} {f['answered']:>9} {f['http_5xx']:>5} {f['http_503']:>6} {recovered:>12}"
        )
    lines.append(
        f"events lost {result['events_lost']}, stuck {result['events_stuck']}; "
        f"invariant violations {result['invariant_violations']}; "
        f"NATS outage {result['nats_outage_s']} s"
    )
    return "\n".join(lines)


async def _run(outage_s: float) -> dict[str, Any]:
    identities = NatsAuth.generate()
    async with (
        EmbeddedPostgres(durable=True) as pg,
        EmbeddedNats(config=identities.server_config()) as bus,
        _services(pg, bus, identities) as (replicas, api_url),
    ):
        engine = create_async_engine(pg.url)
        load = Load()
        async with _load(api_url, load):
            await asyncio.sleep(SETTLE_S)
            await _fault(load, "allocator_killed", replicas[0].kill)
            await _fault(load, "postgres_restart", _restart(pg.stop, pg.start, 2.0))
            await _fault(load, "nats_outage", _restart(bus.stop, bus.start, outage_s))
            load.current = "after"
            await asyncio.sleep(SETTLE_S)
        figures = await _final_figures(engine, bus, identities, load)
        await engine.dispose()
    return {"nats_outage_s": outage_s, "workers": WORKERS, **figures,
            "faults": {k: _fault_figures(v) for k, v in load.windows.items()
                       if k not in ("warmup", "after")}}  # fmt: skip


@contextlib.asynccontextmanager
async def _services(
    pg: EmbeddedPostgres, bus: EmbeddedNats, identities: NatsAuth
) -> AsyncIterator[tuple[list[ServiceProcess], str]]:
    from qshare_allocator.migrate import upgrade

    await upgrade(pg.url)
    as_allocator = identity_env("QSHARE_ALLOCATOR_", identities.credentials(ServiceRole.ALLOCATOR))
    allocator_env = {
        "QSHARE_ALLOCATOR_DATABASE_URL": pg.url, "QSHARE_ALLOCATOR_NATS_URL": bus.url,
        "QSHARE_ALLOCATOR_NATS_RECONNECT_WAIT_S": "0.5",
    } | as_allocator  # fmt: skip
    port = free_port()
    api_env = {
        "QSHARE_API_DATABASE_URL": pg.url, "QSHARE_API_NATS_URL": bus.url,
        "QSHARE_API_PORT": str(port), "QSHARE_API_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN,
        "QSHARE_API_RATE_LIMIT_PER_S": "1e9", "QSHARE_API_RATE_LIMIT_BURST": "1000000000",
        "QSHARE_API_NATS_RECONNECT_WAIT_S": "0.5", "QSHARE_API_ALLOCATOR_TIMEOUT_S": "2",
    } | identity_env("QSHARE_API_", identities.credentials(ServiceRole.API))  # fmt: skip
    replicas = [
        ServiceProcess("qshare_allocator", allocator_env | {"QSHARE_ALLOCATOR_INSTANCE": f"f{i}"},
                       "serving")
        for i in range(2)
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        for replica in replicas:
            await stack.enter_async_context(replica)
        await stack.enter_async_context(ServiceProcess("qshare_api", api_env, "startup complete"))
        await _register(f"http://127.0.0.1:{port}")
        yield replicas, f"http://127.0.0.1:{port}"


async def _register(url: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        for n in range(4):
            gpus = [{"uuid": f"F{n}-{i}", "index": i, "model": "A100", "memory": "80Gi"}
                    for i in range(4)]  # fmt: skip
            (await http.post("/v1/nodes", json={"name": f"f{n}", "gpus": gpus})).raise_for_status()


@contextlib.asynccontextmanager
async def _load(url: str, load: Load) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(_worker(url, load)) for _ in range(WORKERS)]
    try:
        yield
    finally:
        load.stop = True
        await asyncio.gather(*tasks)


async def _worker(url: str, load: Load) -> None:
    """Create a claim, delete it, and again, until told to stop; every answer is counted. A
    create is retried with its idempotency key until answered, so none is left behind."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        while not load.stop:
            body = {"priority": "low", "vcore": 5, "vmemory": "1Gi",
                    "idempotency_key": f"faults-{uuid.uuid4()}"}  # fmt: skip
            create = functools.partial(http.post, "/v1/claims", json=body)
            claim_id = await _until_ok(load, create, True)
            if claim_id is None:
                return
            load.created.append(claim_id)
            path = f"/v1/claims/{claim_id}"
            if await _until_ok(load, functools.partial(http.delete, path), False):
                load.deleted.append(claim_id)


async def _until_ok(
    load: Load, request: Callable[[], Awaitable[httpx.Response]], is_create: bool
) -> str | None:
    """The claim id once a request succeeds (repeated while it fails); None when stopped."""
    while not load.stop or not is_create:
        try:
            response = await request()
        except httpx.HTTPError:
            load.window().unanswered += 1  # connection refused or timed out
        else:
            load.saw(response.status_code, is_create)
            if response.status_code in (200, 201):
                return str(response.json()["id"])
        await asyncio.sleep(0.2)
    return None


async def _fault(load: Load, name: str, inject: Callable[[], Awaitable[None]]) -> None:
    load.current = name
    await inject()
    load.window().restored_at = time.monotonic()
    await asyncio.sleep(SETTLE_S)


def _restart(
    stop: Callable[[], Awaitable[None]], start: Callable[[], Awaitable[None]], down_s: float
) -> Callable[[], Awaitable[None]]:
    async def go() -> None:
        await stop()
        await asyncio.sleep(down_s)
        await start()

    return go


async def _final_figures(
    engine: AsyncEngine, bus: EmbeddedNats, identities: NatsAuth, load: Load
) -> dict[str, int]:
    from qshare_allocator.audit import double_placements, overcommitted_cards

    stuck = await _outbox_left(engine)
    async with engine.connect() as conn:
        violations = (
            await overcommitted_cards(conn)
            + await double_placements(conn)
            + int((await conn.execute(COUNTERS_DISAGREE)).scalar_one())
        )
    seen = await _claim_events(bus, identities)
    expected = {(c, "placed") for c in load.created} | {(c, "released") for c in load.deleted}
    lost = len({e for e in expected if e not in seen and (e[0], "pending") not in seen})
    return {"events_lost": lost, "events_stuck": stuck, "invariant_violations": violations}


async def _outbox_left(engine: AsyncEngine, within_s: float = 30.0) -> int:
    """Outbox rows still there once the relay had `within_s` to publish them."""
    deadline = time.monotonic() + within_s
    while True:
        async with engine.connect() as conn:
            left = int((await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one())
        if left == 0 or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def _claim_events(bus: EmbeddedNats, identities: NatsAuth) -> set[tuple[str, str]]:
    """(claim id, kind) of every claim event in the stream."""
    operator = identities.credentials(ServiceRole.OPERATOR)
    nc = await connect(options_for(bus.url, "bench-faults", operator))
    seen: set[tuple[str, str]] = set()
    try:
        js = nc.jetstream()
        sub = await js.subscribe("qshare.evt.claim.>", ordered_consumer=True)
        with contextlib.suppress(TimeoutError, NatsTimeout):
            while True:
                msg = await sub.next_msg(timeout=2)
                _, _, _, claim_id, kind = msg.subject.split(".")
                seen.add((claim_id, kind))
        await sub.unsubscribe()
    finally:
        await close(nc)
    return seen


def _fault_figures(window: Window) -> dict[str, Any]:
    recovered = window.first_success_after_s
    return {
        "answered": window.answered,
        "unanswered": window.unanswered,
        "http_5xx": window.http_5xx,
        "http_503": window.http_503,
        "recovered_s": None if recovered is None else round(recovered, 3),
    }
