"""The node agent's event pump outlives its failures: a driver error while reading the ring
or a listener that raises is logged and counted, and the next events still reach NATS;
only stop() ends it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from qshare import bus
from qshare.testing.failing_node import FailingNode
from qshare_driver import Event, Node
from qshare_node_agent.events import EventPump

from .conftest import eventually

GiB = 1 << 30
UUID = "GPU-pump-0"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with Node.create(f"pump{uuid.uuid4().hex[:8]}", tmp_path) as created:
        created.add_card(0, UUID, 16 * GiB)
        created.create_vgpu(1, 0, "low", 50, GiB)
        yield created


@pytest.fixture
async def seen(nc: Nats, node: Node) -> AsyncIterator[list[str]]:
    """Kinds of the events published for `node`."""
    kinds: list[str] = []

    async def note(msg: Msg) -> None:
        kinds.append(msg.subject.rsplit(".", 1)[-1])

    sub = await nc.subscribe(f"qshare.evt.gpu.{node.name}.>", cb=note)
    await bus.settled(nc)
    yield kinds
    await sub.unsubscribe()


def failures(node: Node, stage: str) -> float:
    labels = {"node": node.name, "stage": stage}
    return REGISTRY.get_sample_value("qshare_node_event_pump_failures_total", labels) or 0.0


async def pumping(nc: Nats, node: Any, listeners: list[Any] | None = None) -> EventPump:
    pump = EventPump(node, nc, node.name, {0: UUID})
    pump.listeners.extend(listeners or [])
    pump.start()
    return pump


def suspend_and_resume(node: Node) -> None:
    node.suspend(1)
    node.resume(1)


async def test_events_are_published_after_a_listener_raises(
    nc: Nats, node: Node, seen: list[str]
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    pump = await pumping(nc, node, [broken])
    suspend_and_resume(node)
    await eventually(lambda: _holds({"suspended", "resumed"} <= set(seen)), within_s=10)
    await pump.stop()


async def test_a_listener_that_raises_is_counted(nc: Nats, node: Node, seen: list[str]) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    pump = await pumping(nc, node, [broken])
    node.suspend(1)
    await eventually(lambda: _holds(failures(node, "listener") >= 1), within_s=10)
    await pump.stop()


async def test_events_are_published_after_a_driver_error_on_the_ring(
    nc: Nats, node: Node, seen: list[str]
) -> None:
    flaky = FailingNode(node, "next_event", 2, "ring read failed")
    pump = await pumping(nc, flaky)
    await eventually(lambda: _holds(flaky.failures == 0), within_s=10)
    suspend_and_resume(node)
    await eventually(lambda: _holds({"suspended", "resumed"} <= set(seen)), within_s=10)
    await pump.stop()


async def test_a_driver_error_on_the_ring_is_counted(nc: Nats, node: Node) -> None:
    before = failures(node, "read")
    pump = await pumping(nc, FailingNode(node, "next_event", 3, "ring read failed"))
    await eventually(lambda: _holds(failures(node, "read") >= before + 3), within_s=10)
    await pump.stop()


async def test_stop_ends_a_pump_whose_reads_keep_failing(nc: Nats, node: Node) -> None:
    pump = await pumping(nc, FailingNode(node, "next_event", -1, "ring read failed"))
    await eventually(lambda: _holds(failures(node, "read") >= 2), within_s=10)
    await asyncio.wait_for(pump.stop(), 5)


async def _holds(value: bool) -> bool:
    return value
