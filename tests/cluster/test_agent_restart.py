"""A node agent restarted on the segment its predecessor left (it adopts it) tells the
control plane what changed on its cards while no agent was reading the driver's events, and
a resume the preemptor sent while no agent was there still reaches the vGPUs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import httpx
from nats.aio.client import Client as Nats

from qshare_driver import Client
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings
from qshare_preemptor.app import Preemptor

from .conftest import eventually, ready_claim
from .test_preemptor_events import publish


def settings(bus_url: str, shm_dir: Path) -> NodeAgentSettings:
    return NodeAgentSettings(
        name=f"adopting-{os.getpid()}", nats_url=bus_url, simulate="2:16Gi", shm_dir=shm_dir,
        heartbeat_s=0.5, release_delay_s=0.02, keep_segment_on_stop=True,
    )  # fmt: skip


async def stop_removing_segments(*agents: NodeAgent | None) -> None:
    for agent in agents:
        if agent is not None:
            agent.settings.keep_segment_on_stop = False
            await agent.stop()


def suspended(agent: NodeAgent, local_id: int) -> bool:
    return agent.node.vgpu_stats(local_id).suspended


async def test_a_gang_suspended_before_a_restart_resumes_when_its_card_went_idle_meanwhile(
    api: httpx.AsyncClient, bus_url: str, tmp_path: Path, preemptor: Preemptor
) -> None:
    first = NodeAgent(settings(bus_url, tmp_path))
    await first.start()
    second: NodeAgent | None = None
    try:
        await asyncio.wait_for(first.registered.wait(), 20)
        gang = await ready_claim(api, count=2)
        hp = await ready_claim(api, priority="high", vcore=50)
        shared = next(v for v in gang["vgpus"] if v["gpu"] == hp["vgpus"][0]["gpu"])
        other = next(v for v in gang["vgpus"] if v["gpu"] != hp["vgpus"][0]["gpu"])
        segment = first.settings.segment_name
        client = Client.attach(segment, hp["vgpus"][0]["local_id"], tmp_path)
        low = Client.attach(segment, shared["local_id"], tmp_path)
        client.launch_begin()
        await eventually(lambda: _holds(lambda: suspended(first, other["local_id"])))
        waiting = asyncio.create_task(asyncio.to_thread(low.launch_begin))  # behind the gate
        await first.stop()
        client.launch_end()  # the waiting LP launch opens the gate: idle, and no agent reads it
        await asyncio.wait_for(waiting, 10)
        low.launch_end()
        second = NodeAgent(settings(bus_url, tmp_path))
        await second.start()
        agent = second
        await eventually(lambda: _holds(lambda: not suspended(agent, other["local_id"])), 10)
        client.detach()
        low.detach()
    finally:
        await stop_removing_segments(first, second)


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()


async def test_a_resume_the_node_missed_while_restarting_is_sent_again(
    api: httpx.AsyncClient, nc: Nats, bus_url: str, tmp_path: Path, preemptor: Preemptor
) -> None:
    assert preemptor.service is not None
    service = preemptor.service
    first = NodeAgent(settings(bus_url, tmp_path))
    await first.start()
    second: NodeAgent | None = None
    try:
        await asyncio.wait_for(first.registered.wait(), 20)
        gang = await ready_claim(api, count=2)
        busy, other = gang["vgpus"]
        await publish(nc, first.name, busy["gpu"], "busy")
        await eventually(lambda: _holds(lambda: suspended(first, other["local_id"])))
        await first.stop()
        before = service.card_events
        await publish(nc, first.name, busy["gpu"], "idle")  # its resume finds no agent
        await eventually(lambda: _holds(lambda: service.card_events > before))
        second = NodeAgent(settings(bus_url, tmp_path))
        await second.start()
        agent = second
        await eventually(lambda: _holds(lambda: not suspended(agent, other["local_id"])), 10)
    finally:
        await stop_removing_segments(first, second)
