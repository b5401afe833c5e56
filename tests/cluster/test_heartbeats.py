"""A node agent keeps heartbeating whatever happens while it reads its cards' health: a card
health it cannot read is reported unhealthy (NVML's rule: a card it cannot query is), and
the next readable health is reported as it is."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import subjects
from qshare_node_agent.app import NodeAgent

from .conftest import StartAgent, eventually

Beats = list[list[str]]


@pytest.fixture
async def beating(
    nc: Nats, start_agent: StartAgent, tmp_path: Path
) -> AsyncIterator[tuple[NodeAgent, Path, Beats]]:
    """An agent whose card health comes from a file, and the unhealthy lists it reports."""
    health = tmp_path / "unhealthy"
    agent = await start_agent(sim_unhealthy_file=health)
    beats: Beats = []

    async def note(msg: Msg) -> None:
        beats.append(list(json.loads(msg.data)["data"]["unhealthy"]))

    sub = await nc.subscribe(subjects.heartbeat(agent.name), cb=note)
    await bus.settled(nc)
    yield agent, health, beats
    await sub.unsubscribe()


async def test_a_card_health_that_cannot_be_read_is_reported_unhealthy(
    beating: tuple[NodeAgent, Path, Beats],
) -> None:
    await _every_card_reported_once_health_is_unreadable(*beating)


async def test_heartbeats_report_health_again_once_it_can_be_read(
    beating: tuple[NodeAgent, Path, Beats],
) -> None:
    _agent, health, beats = beating
    await _every_card_reported_once_health_is_unreadable(*beating)
    health.write_text("")
    seen = len(beats)
    await eventually(lambda: _holds([] in beats[seen:]), 10)


async def _every_card_reported_once_health_is_unreadable(
    agent: NodeAgent, health: Path, beats: Beats
) -> None:
    health.write_bytes(b"\xff\xfe not text")
    every = sorted(c.uuid for c in agent.cards)
    await eventually(lambda: _holds(every in [sorted(b) for b in beats]), 10)


async def _holds(value: bool) -> bool:
    return value
