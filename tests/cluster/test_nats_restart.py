"""NATS stopped and started again on the same port and JetStream store while claims are
created and deleted: afterwards every claim converges and no event is lost.

The test owns its NATS server and its database (on the session's Postgres server), so the
outage touches no other test's services."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.contracts import subjects
from qshare.settings import ClusterSettings
from qshare.testing.servers import EmbeddedNats
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import ADMIN_TOKEN, admin_client, claim_until, eventually

RULES = ClusterSettings(node_timeout_s=60, min_vgpu_mib=1024, gib_per_vgpu=4)
"""The node stays Ready through the outage: its heartbeats cannot arrive meanwhile."""
RECONNECT_S = 0.1
SPEC = {"priority": "low", "vcore": 10, "vmemory": "1Gi"}
UNPUBLISHED = "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_dead)"
pytestmark = pytest.mark.timeout(180)


@dataclass
class Cluster:
    bus: EmbeddedNats
    api: httpx.AsyncClient
    database_url: str


@pytest.fixture
async def own_database(scratch_url: str) -> str:
    """A fresh, migrated database on the session's Postgres server."""
    await upgrade(scratch_url)
    return scratch_url


@pytest.fixture
async def cluster(own_database: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Allocator, API and one node agent of two cards on a NATS server of their own."""
    async with EmbeddedNats() as bus:
        common: dict[str, Any] = {
            "database_url": own_database, "nats_url": bus.url, "cluster": RULES,
            "nats_reconnect_wait_s": RECONNECT_S,
        }  # fmt: skip
        allocator = Allocator(
            AllocatorSettings(
                **common,
                instance="restart",
                pending_sweep_s=0.5,
                dispatch_scan_s=0.3,
                apply_timeout_s=60,
            )
        )
        await allocator.start()
        agent = NodeAgent(
            NodeAgentSettings(
                name=f"restart-{os.getpid()}",
                nats_url=bus.url,
                simulate="2:16Gi",
                shm_dir=tmp_path,
                heartbeat_s=0.5,
                keep_segment_on_stop=False,
                nats_reconnect_wait_s=RECONNECT_S,
            )
        )
        await agent.start()
        app = create_app(
            ApiSettings(**common, bootstrap_admin_token=ADMIN_TOKEN, allocator_timeout_s=1.0)
        )
        try:
            await asyncio.wait_for(agent.registered.wait(), 20)
            async with admin_client(app) as api:
                yield Cluster(bus, api, own_database)
        finally:
            await agent.stop()
            await allocator.stop()


async def create(api: httpx.AsyncClient, key: str) -> str:
    """Create a claim, retrying with the same idempotency key while the API answers 503."""
    while True:
        response = await api.post("/v1/claims", json=SPEC | {"idempotency_key": key})
        if response.status_code != 503:
            assert response.status_code in (200, 201), response.text
            return str(response.json()["id"])
        await asyncio.sleep(0.1)


async def delete(api: httpx.AsyncClient, claim_id: str) -> None:
    """Delete a claim, retrying while the API answers 503."""
    while (response := await api.delete(f"/v1/claims/{claim_id}")).status_code == 503:
        await asyncio.sleep(0.1)
    assert response.status_code == 200, response.text


async def released_ids(api: httpx.AsyncClient) -> set[str]:
    page = (await api.get("/v1/claims", params={"status": "released", "limit": 500})).json()
    return {c["id"] for c in page["items"]}


async def take_events(consumer: Any, kinds: dict[str, list[str]]) -> None:
    """Add the claim events the durable consumer gives in one pass to `kinds` (per claim).

    A pass ends at the first fetch that times out, whichever way nats.py says so: when the
    event loop stalls past the deadline (a loaded machine) its fetch raises a plain
    `TimeoutError`, not `nats.errors.TimeoutError`; let through, that one ended the wait for
    the remaining events early and a late one was reported lost."""
    while True:
        try:
            batch = await consumer.fetch(100, timeout=2.0)
        except TimeoutError:  # nats.errors.TimeoutError is one too
            return
        for msg in batch:
            await msg.ack()
            claim_id, kind = msg.subject.split(".")[3:5]
            kinds.setdefault(claim_id, []).append(kind)


async def stored(database_url: str, query: str) -> int:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(query))).scalar_one())
    finally:
        await engine.dispose()


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"


async def test_after_a_nats_restart_every_claim_converges_and_no_event_is_lost(
    cluster: Cluster,
) -> None:
    api = cluster.api
    nc = await nats.connect(cluster.bus.url, max_reconnect_attempts=-1,
                            reconnect_time_wait=RECONNECT_S)  # fmt: skip
    js = nc.jetstream()
    await js.add_consumer(
        subjects.EVENTS_STREAM,
        ConsumerConfig(
            durable_name="restart-check",
            deliver_policy=DeliverPolicy.ALL,
            filter_subject="qshare.evt.claim.>",
        ),
    )
    consumer = await js.pull_subscribe_bind("restart-check", stream=subjects.EVENTS_STREAM)
    before = [await create(api, f"before-{i}") for i in range(4)]
    for claim_id in before:
        await claim_until(api, claim_id, "ready")
    kept, deleted_late, deleted_across = before[:2], before[2], before[3]
    await delete(api, deleted_across)
    await cluster.bus.stop()

    assert_unavailable(await api.post("/v1/claims", json=SPEC))
    assert_unavailable(await api.delete(f"/v1/claims/{deleted_late}"))
    during = [asyncio.create_task(create(api, f"during-{i}")) for i in range(2)]
    late_delete = asyncio.create_task(delete(api, deleted_late))
    await asyncio.sleep(1.0)
    assert (await api.get(f"/v1/claims/{kept[0]}")).json()["status"] == "ready"

    await cluster.bus.start()
    created = [*await asyncio.gather(*during), await create(api, "after-0")]
    await late_delete
    for claim_id in [*kept, *created]:
        await claim_until(api, claim_id, "ready", within_s=30)

    async def both_released() -> bool:
        return {deleted_late, deleted_across} <= await released_ids(api)

    await eventually(both_released, 30)
    everyone = {*before, *created}
    kinds: dict[str, list[str]] = {}

    async def every_ready_delivered() -> bool:
        await take_events(consumer, kinds)
        return all("ready" in kinds.get(c, []) for c in everyone)

    with contextlib.suppress(TimeoutError):
        await eventually(every_ready_delivered, 60)
    await nc.close()
    missing = {c for c in everyone if "ready" not in kinds.get(c, [])}
    dead = await stored(cluster.database_url, "SELECT count(*) FROM outbox_dead")
    assert (missing, dead) == (set(), 0), kinds
    assert [sorted(kinds[c]) for c in kept] == [["placed", "ready"]] * 2
    assert all("released" in kinds[c] for c in (deleted_late, deleted_across))
    claims_stored = await stored(cluster.database_url, "SELECT count(*) FROM claims")
    left = await stored(cluster.database_url, UNPUBLISHED)
    assert (claims_stored, left) == (len(everyone), 0)
