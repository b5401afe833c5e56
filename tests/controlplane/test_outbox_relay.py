"""The outbox relay publishes outside any database transaction (a slow NATS holds no row
locks open), two relays never publish the same row at once, and a relay takes the rows after
those another relay holds, but never a claim's event while another relay holds an earlier one
of that claim. Each test's relays work on an outbox of their own (a schema of the session's
database), apart from the replicas'."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare.contracts.schema import outbox, outbox_dead
from qshare_allocator import outbox as outbox_module
from qshare_allocator.app import Allocator
from qshare_allocator.outbox import OutboxRelay

APP = "outbox-relay-under-test"


class HeldPublishes(JetStreamContext):
    """The real JetStream context, each publish waiting until the test lets it through."""

    def __init__(self, nc: Client) -> None:
        super().__init__(nc)
        self.entered = asyncio.Event()
        self.let_through = asyncio.Event()

    async def publish(self, subject: str, payload: bytes = b"", *args: Any,
                      **kwargs: Any) -> api.PubAck:  # fmt: skip
        self.entered.set()
        await self.let_through.wait()
        return await super().publish(subject, payload, *args, **kwargs)


@pytest.fixture
async def own_outbox(engine: AsyncEngine, database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine whose `outbox` is a fresh one in a schema of its own; its connections are
    named `APP` in pg_stat_activity."""
    schema = f"relay_{uuid.uuid4().hex[:12]}"
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {schema}"))
    settings = {"search_path": schema, "application_name": APP}
    own = create_async_engine(database_url, connect_args={"server_settings": settings})
    async with own.begin() as conn:
        await conn.run_sync(lambda sync: outbox.metadata.create_all(
            sync, tables=[outbox, outbox_dead]))  # fmt: skip
    yield own
    await own.dispose()
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


async def _one_event(own: AsyncEngine, subject: str | None = None) -> None:
    async with own.begin() as conn:
        subject = subject or f"qshare.evt.claim.{uuid.uuid4()}.probe"
        await conn.execute(outbox.insert().values(subject=subject, body=b"{}"))


async def _subjects_left(own: AsyncEngine) -> list[str]:
    async with own.connect() as conn:
        return list((await conn.execute(text("SELECT subject FROM outbox"))).scalars())


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> int:
    """Batches of 4 rows, so that a test's backlog is a few batches long."""
    monkeypatch.setattr(outbox_module, "BATCH", 4)
    return 4


@contextlib.asynccontextmanager
async def _a_relay_holding_a_batch(
    own: AsyncEngine, nc: Client
) -> AsyncIterator[asyncio.Task[int]]:
    """A relay that took the oldest batch and is held publishing it until the block ends (a
    failed test's too: its advisory locks would hold the same ids in the next test's outbox);
    its drain is then done."""
    held = HeldPublishes(nc)
    draining = asyncio.create_task(OutboxRelay(own, held, scan_s=60).drain())
    try:
        await asyncio.wait_for(held.entered.wait(), timeout=10)
        yield draining
    finally:
        held.let_through.set()
        await asyncio.wait_for(asyncio.wait({draining}), timeout=10)


async def _in_transaction_while_publishing(engine: AsyncEngine) -> int:
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = :app AND state LIKE 'idle in transaction%'"
    )
    async with engine.connect() as conn:
        return int((await conn.execute(query, {"app": APP})).scalar_one())


async def _left(own: AsyncEngine) -> int:
    async with own.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one())


async def test_a_blocked_publish_holds_no_transaction_open(
    nc: Client, replicas: list[Allocator], engine: AsyncEngine, own_outbox: AsyncEngine
) -> None:
    await _one_event(own_outbox)
    held = HeldPublishes(nc)
    draining = asyncio.create_task(OutboxRelay(own_outbox, held, scan_s=60).drain())
    await asyncio.wait_for(held.entered.wait(), timeout=10)
    open_while_blocked = await _in_transaction_while_publishing(engine)
    held.let_through.set()
    assert await asyncio.wait_for(draining, timeout=10) == 1
    assert open_while_blocked == 0
    assert await _left(own_outbox) == 0


async def test_a_row_another_relay_is_publishing_is_left_to_it(
    nc: Client, replicas: list[Allocator], own_outbox: AsyncEngine
) -> None:
    await _one_event(own_outbox)
    first, second = HeldPublishes(nc), HeldPublishes(nc)
    draining = asyncio.create_task(OutboxRelay(own_outbox, first, scan_s=60).drain())
    await asyncio.wait_for(first.entered.wait(), timeout=10)
    second_drain = OutboxRelay(own_outbox, second, scan_s=60).drain()
    with contextlib.suppress(TimeoutError):  # a relay publishing the row waits for good
        await asyncio.wait_for(second_drain, timeout=10)
    first.let_through.set()
    assert await asyncio.wait_for(draining, timeout=10) == 1
    assert not second.entered.is_set()


async def test_a_relay_takes_the_rows_after_those_another_relay_holds(
    nc: Client, replicas: list[Allocator], own_outbox: AsyncEngine, small_batches: int
) -> None:
    for _ in range(small_batches + 2):
        await _one_event(own_outbox)
    second = OutboxRelay(own_outbox, nc.jetstream(), scan_s=60)
    async with _a_relay_holding_a_batch(own_outbox, nc) as first:
        assert await asyncio.wait_for(second.drain(), timeout=10) == 2
    assert first.result() == small_batches
    assert await _left(own_outbox) == 0


async def test_a_claims_later_event_waits_while_another_relay_holds_an_earlier_one(
    nc: Client, replicas: list[Allocator], own_outbox: AsyncEngine, small_batches: int
) -> None:
    claim = f"qshare.evt.claim.{uuid.uuid4()}"
    for _ in range(small_batches - 1):
        await _one_event(own_outbox)
    await _one_event(own_outbox, f"{claim}.placed")  # the last row of the held batch
    await _one_event(own_outbox, f"{claim}.ready")
    await _one_event(own_outbox)
    second = OutboxRelay(own_outbox, nc.jetstream(), scan_s=60)
    async with _a_relay_holding_a_batch(own_outbox, nc) as first:
        assert await asyncio.wait_for(second.drain(), timeout=10) == 1
        assert f"{claim}.ready" in await _subjects_left(own_outbox)
    assert first.result() == small_batches + 1
    assert await _left(own_outbox) == 0
