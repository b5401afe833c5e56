"""A node agent's heartbeats go on while reading its cards' health hangs (NVML does, on a
card that fell off the bus): the read counts as failed after a heartbeat period (and a
floor), every card is reported unhealthy, and no second read starts while the first hangs."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import subjects
from qshare_node_agent import app

from .conftest import StartAgent, eventually


async def test_heartbeats_go_on_while_reading_card_health_hangs(
    nc: Nats, start_agent: StartAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await start_agent()
    beats: list[list[str]] = []

    async def note(msg: Msg) -> None:
        beats.append(sorted(json.loads(msg.data)["data"]["unhealthy"]))

    sub = await nc.subscribe(subjects.heartbeat(agent.name), cb=note)
    await bus.settled(nc)
    release, reads = threading.Event(), []

    def hanging(*args: Any) -> list[str]:  # NVML stands in here: outside our control
        reads.append(args)
        release.wait(30)
        return []

    monkeypatch.setattr(app, "unhealthy", hanging)
    monkeypatch.setattr(app, "HEALTH_READ_MIN_S", 0.5)  # not the 5 s a real node waits
    every = sorted(c.uuid for c in agent.cards)
    try:
        await eventually(lambda: _holds(beats[-3:] == [every] * 3), within_s=10)
        assert len(reads) == 1
    finally:
        release.set()
        await sub.unsubscribe()


async def _holds(value: bool) -> bool:
    return value
