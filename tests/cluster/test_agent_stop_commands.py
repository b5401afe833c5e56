"""A node agent that is stopping refuses the commands that still reach it (`cmd.register`,
`cmd.apply`) and ignores announce requests: none starts work after its tasks were
cancelled. Each test holds the stop once those tasks are gone, before NATS closes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from nats.aio.client import Client as Nats

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import (
    AnnounceRequest,
    ApplyDesired,
    ApplyReply,
    DesiredVgpu,
    RegisterCommand,
)
from qshare.contracts.domain import Priority
from qshare.contracts.errors import ERROR_HEADER, Unavailable
from qshare_node_agent.app import NodeAgent

from .conftest import StartAgent

Held = Callable[[], Awaitable[None]]


@pytest.fixture
async def stopping_agent(start_agent: StartAgent) -> AsyncIterator[NodeAgent]:
    """An agent whose stop is held where it stops the event pump (tasks and announcer done)."""
    agent = await start_agent()
    pump = agent._pump
    assert pump is not None
    arrived, release = asyncio.Event(), asyncio.Event()
    stop_pump = pump.stop

    async def held() -> None:
        arrived.set()
        await release.wait()
        await stop_pump()

    pump.stop = held  # type: ignore[method-assign]
    stopping = asyncio.create_task(agent.stop())
    await asyncio.wait_for(arrived.wait(), 20)
    yield agent
    release.set()
    await asyncio.wait_for(stopping, 20)


async def test_a_register_command_during_stop_is_refused_and_starts_no_registration(
    nc: Nats, stopping_agent: NodeAgent
) -> None:
    body = envelope.wrap("test", "io.qshare.node.register", RegisterCommand(reason="test"))
    subject = subjects.node_command(stopping_agent.name, "register")
    reply = await nc.request(subject, envelope.encode(body), timeout=5)
    assert reply.headers is not None and "stopping" in reply.headers.get(ERROR_HEADER, "")
    assert stopping_agent._registering is None


async def test_an_apply_during_stop_is_refused_and_changes_nothing(
    nc: Nats, stopping_agent: NodeAgent
) -> None:
    fields = {
        "local_id": 1, "id": uuid.uuid4(), "claim_id": uuid.uuid4(),
        "gpu": stopping_agent.cards[0].uuid, "priority": Priority.LOW, "vcore": 10,
        "vmemory_mib": 1024,
    }  # fmt: skip
    desired = ApplyDesired(
        node=stopping_agent.name, generation=1, vgpus=[DesiredVgpu.model_validate(fields)]
    )
    subject = subjects.node_command(stopping_agent.name, "apply")
    with pytest.raises(Unavailable, match="stopping"):
        await rpc.call(nc, subject, "test", desired, ApplyReply)
    assert stopping_agent.applied == {}


async def test_an_announce_request_during_stop_is_ignored(
    nc: Nats, stopping_agent: NodeAgent
) -> None:
    announcer = stopping_agent.announcer
    assert announcer is not None
    before = announcer.requests
    body = envelope.wrap("test", "io.qshare.nodes.announce", AnnounceRequest())
    await nc.publish(subjects.NODES_ANNOUNCE, envelope.encode(body))
    await bus.settled(nc)
    await asyncio.sleep(0.3)  # delivered well within; a pass never depends on it
    assert announcer.requests == before
