"""The node agent's usage reports outlive a failed read of the driver's counters, the first
read included: one failure never ends them for the agent's lifetime."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import subjects
from qshare.service import cancelled
from qshare.testing.failing_node import FailingNode
from qshare_driver import Node
from qshare_node_agent.usage import UsageReader, report

from .conftest import eventually

GiB = 1 << 30
UUID = "GPU-usage-0"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with Node.create(f"usage{uuid.uuid4().hex[:8]}", tmp_path) as created:
        created.add_card(0, UUID, 16 * GiB)
        created.create_vgpu(1, 0, "high", 50, GiB)
        yield created


async def test_usage_is_reported_after_the_first_read_of_the_counters_fails(
    nc: Nats, node: Node
) -> None:
    got: list[bytes] = []

    async def note(msg: Msg) -> None:
        got.append(msg.data)

    sub = await nc.subscribe(subjects.usage(node.name), cb=note)
    await bus.settled(nc)
    registered = asyncio.Event()
    registered.set()
    reader = UsageReader(FailingNode(node, "list_vgpus", 1, "listing failed"), node.name, {0: UUID})  # type: ignore[arg-type]
    task = asyncio.create_task(report(reader, nc, "test", 0.05, registered))
    try:
        await eventually(lambda: _holds(len(got) >= 2), within_s=10)
    finally:
        await cancelled(task)
        await sub.unsubscribe()


async def _holds(value: bool) -> bool:
    return value
