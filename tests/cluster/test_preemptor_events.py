"""The preemptor's handling of card events that are repeated or forged: a busy event delivered
again suspends and resumes a gang's vGPUs once each; an event a node publishes about another
node's card changes nothing (a node's NATS identity may publish under its own name only, but
any card uuid); a flood of events is handled a bounded number at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import envelope, subjects
from qshare.contracts.agent import GpuEvent
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import MAX_IN_FLIGHT, Preemptor

from .conftest import StartAgent, eventually, ready_claim

Resumes = list[list[int]]


@pytest.fixture
async def resumes(nc: Nats, start_agent: StartAgent) -> AsyncIterator[tuple[NodeAgent, Resumes]]:
    """A two-card agent and the local ids of every `cmd.resume` sent to it."""
    agent = await start_agent(cards=2)
    seen: Resumes = []

    async def note(msg: Msg) -> None:
        seen.append(list(json.loads(msg.data)["data"]["local_ids"]))

    sub = await nc.subscribe(subjects.node_command(agent.name, "resume"), cb=note)
    await bus.settled(nc)
    yield agent, seen
    await sub.unsubscribe()


async def publish(nc: Nats, node: str, gpu: str, kind: str) -> None:
    """A card event as the node agent of `node` publishes it."""
    body = GpuEvent(node=node, gpu=gpu, card=0, kind=kind, seq=1, time_ns=1)
    wrapped = envelope.wrap(f"qshare-node-agent/{node}", f"io.qshare.gpu.{kind}", body)
    await nc.publish(subjects.gpu_event(node, gpu, kind), envelope.encode(wrapped))


async def handled(preemptor: Preemptor, count: int) -> None:
    """Wait until the preemptor has handled `count` card events since it started."""
    assert preemptor.service is not None
    service = preemptor.service
    await eventually(lambda: _holds(lambda: service.card_events >= count))


def events_so_far(preemptor: Preemptor) -> int:
    assert preemptor.service is not None
    return preemptor.service.card_events


async def test_a_repeated_busy_event_resumes_each_gang_vgpu_once(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, resumes: tuple[NodeAgent, Resumes]
) -> None:
    agent, seen = resumes
    gang = await ready_claim(api, count=2)
    busy, other = gang["vgpus"]
    before = events_so_far(preemptor)
    for _ in range(3):
        await publish(nc, agent.name, busy["gpu"], "busy")
    await handled(preemptor, before + 3)
    await publish(nc, agent.name, busy["gpu"], "idle")
    await eventually(lambda: _holds(lambda: bool(seen)))
    assert seen == [[other["local_id"]]]


def suspended(agent: NodeAgent, local_id: int) -> bool:
    return agent.node.vgpu_stats(local_id).suspended


async def test_a_busy_event_about_another_nodes_card_suspends_nothing(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    gang = await ready_claim(api, count=2)
    busy, other = gang["vgpus"]
    before = events_so_far(preemptor)
    await publish(nc, "some-other-node", busy["gpu"], "busy")
    await handled(preemptor, before + 1)
    assert not suspended(agent, other["local_id"])


async def test_an_idle_event_about_another_nodes_card_resumes_nothing(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    gang = await ready_claim(api, count=2)
    busy, other = gang["vgpus"]
    await publish(nc, agent.name, busy["gpu"], "busy")
    await eventually(lambda: _holds(lambda: suspended(agent, other["local_id"])))
    before = events_so_far(preemptor)
    await publish(nc, "some-other-node", busy["gpu"], "idle")
    await handled(preemptor, before + 1)
    assert suspended(agent, other["local_id"])
    await publish(nc, agent.name, busy["gpu"], "idle")
    await eventually(lambda: _holds(lambda: not suspended(agent, other["local_id"])))


async def test_a_flood_of_card_events_is_handled_a_bounded_number_at_a_time(
    nc: Nats, preemptor: Preemptor
) -> None:
    before = events_so_far(preemptor)
    for n in range(1000):
        await publish(nc, "flooding-node", f"GPU-none-{n % 7}", "busy")
    await nc.flush()
    most = 0
    while events_so_far(preemptor) < before + 1000:
        most = max(most, preemptor.in_flight)
        await asyncio.sleep(0.005)
    assert most <= MAX_IN_FLIGHT


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()
