"""A node deleted over REST while its agent runs comes back, as a kubelet re-creates a deleted
Node object: its heartbeat names a node the allocator does not know, the allocator asks it
to register again (`cmd.register`, at most once per interval per node), and the agent does.
The claims that held vGPUs there stay failed (what the deletion did) and the node comes back
without their vGPUs; a node whose agent is gone is asked in vain and stays deleted."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import envelope, subjects
from qshare.contracts.nodes import Heartbeat
from qshare_allocator.app import Allocator

from .conftest import StartAgent, claim_until, eventually, ready_claim


async def node_found(api: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    response = await api.get(f"/v1/nodes/{name}")
    return dict(response.json()) if response.status_code == 200 else None


async def test_a_node_deleted_while_its_agent_runs_registers_again(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    claim = await ready_claim(api)
    removed = await api.delete(f"/v1/nodes/{agent.name}")
    assert removed.json()["failed_claims"] == [claim["id"]]

    await eventually(lambda: _holds(lambda: agent.reregistrations >= 1))
    found = await node_found(api, agent.name)
    assert found is not None and (found["gpus"], found["status"]) == (2, "Ready")
    assert (await claim_until(api, claim["id"], "failed"))["status"] == "failed"
    await eventually(lambda: _holds(lambda: not agent.applied))  # the failed claim's vGPU
    again = await ready_claim(api)
    assert again["node"] == agent.name


Commands = list[str]


@pytest.fixture
async def register_commands(nc: Nats) -> AsyncIterator[tuple[str, Commands]]:
    """A node name no agent runs under, and the `cmd.register` sent to it."""
    name = f"ghost-{os.getpid()}"
    seen: Commands = []

    async def note(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe(subjects.node_command(name, "register"), cb=note)
    await bus.settled(nc)
    yield name, seen
    await sub.unsubscribe()


async def beat(nc: Nats, node: str) -> None:
    body = envelope.wrap(f"qshare-node-agent/{node}", "io.qshare.node.heartbeat", Heartbeat())
    await nc.publish(subjects.heartbeat(node), envelope.encode(body))


async def test_heartbeats_of_an_unknown_node_ask_it_to_register_once_per_interval(
    nc: Nats, allocator: Allocator, register_commands: tuple[str, Commands]
) -> None:
    name, seen = register_commands
    before, started = allocator.served, time.monotonic()
    for _ in range(10):
        await beat(nc, name)
    await eventually(lambda: _holds(lambda: allocator.served >= before + 10 and bool(seen)))
    await bus.settled(nc)
    # once per 2 s interval: one ask, unless a loaded machine took longer over the beats
    intervals = 1 + int((time.monotonic() - started) / allocator.settings.register_again_s)
    assert seen[:1] == [subjects.node_command(name, "register")]
    assert seen == seen[:1] * len(seen) and len(seen) <= intervals


async def test_a_node_deleted_after_its_agent_stopped_stays_deleted(
    api: httpx.AsyncClient, nc: Nats, allocator: Allocator, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    await agent.stop()
    assert (await api.delete(f"/v1/nodes/{agent.name}")).status_code == 200
    asked = allocator.reregistration.asked
    await beat(nc, agent.name)  # a heartbeat still in flight when it was deleted
    await eventually(lambda: _holds(lambda: allocator.reregistration.asked > asked))
    await bus.settled(nc)
    assert await node_found(api, agent.name) is None


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()
