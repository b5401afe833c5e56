"""The outbox relay publishes outside any database transaction (a slow NATS holds no row
locks open), and two relays never publish the same row at once. Each test's relays work on
an outbox of their own (a schema of the session's database), apart from the replicas'."""

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


async def _one_event(own: AsyncEngine) -> None:
    async with own.begin() as conn:
        subject = f"qshare.evt.claim.{uuid.uuid4()}.probe"
        await conn.execute(outbox.insert().values(subject=subject, body=b"{}"))


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
