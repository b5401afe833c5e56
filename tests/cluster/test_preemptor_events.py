"""The preemptor's handling of card events that are repeated or forged: a busy event delivered
again suspends and resumes a gang's vGPUs once each; an event a node publishes about another
node's card changes nothing (a node's NATS identity may publish under its own name only, but
any card uuid); a flood of events is handled a bounded number at a time."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare import bus
from qshare.contracts import envelope, subjects
from qshare.contracts.agent import GpuEvent
from qshare_node_agent.app import NodeAgent
from qshare_preemptor import service as service_module
from qshare_preemptor.app import MAX_IN_FLIGHT, Preemptor
from qshare_preemptor.gangs import card_owner
from qshare_preemptor.service import OWNER_TRUSTED_S

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


async def test_a_cards_busy_then_idle_are_handled_in_that_order_whatever_reads_take(
    api: httpx.AsyncClient,
    nc: Nats,
    preemptor: Preemptor,
    start_agent: StartAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """High priority on a card for less than an inventory read (release delay 0, or `auto`'s
    fraction of a millisecond): busy and idle arrive back to back, and each event reads the
    card's node when that is not fresh. Before, the idle event's read could finish first: idle
    was handled (nothing held), then busy suspended the gang, which stayed suspended on an
    idle card until high priority ran there again. Here the busy event's read (real Postgres)
    is made to finish last."""
    agent = await start_agent(cards=2)
    gang = await ready_claim(api, count=2)
    busy, other = gang["vgpus"]
    await asyncio.sleep(OWNER_TRUSTED_S + 0.1)  # what the start's announce read is stale now
    reads = 0

    async def busy_read_last(conn: AsyncConnection, gpu: str) -> str | None:
        nonlocal reads
        reads += 1
        if reads == 1:  # the busy event's, when the events are handled in order
            await asyncio.sleep(0.5)
        return await card_owner(conn, gpu)

    monkeypatch.setattr(service_module, "card_owner", busy_read_last)
    before = events_so_far(preemptor)
    await publish(nc, agent.name, busy["gpu"], "busy")
    await publish(nc, agent.name, busy["gpu"], "idle")
    await handled(preemptor, before + 2)
    await eventually(lambda: _holds(lambda: not suspended(agent, other["local_id"])))
    assert preemptor.service is not None and not preemptor.service.held_claims()


async def test_an_event_about_a_card_not_registered_yet_is_no_warning_but_a_foreign_one_is(
    nc: Nats, preemptor: Preemptor, start_agent: StartAgent, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent publishes its cards' state as it starts, before its registration is in, so
    `qshare up` printed a warning per card calling each "not a card of that node". Only an
    event about another node's card (a node speaking for another) is worth one."""
    agent = await start_agent(cards=1)
    before = events_so_far(preemptor)
    with caplog.at_level(logging.INFO, logger=service_module.__name__):
        await publish(nc, agent.name, "GPU-not-registered-yet", "busy")
        await publish(nc, "some-other-node", agent.cards[0].uuid, "busy")
        await handled(preemptor, before + 2)
        # the agent's own start announcement of its card may be handled after `before` was
        # read and be one of the two counted: wait for both events' own outcomes
        await eventually(lambda: _holds(lambda: bool(said(caplog, "GPU-not-registered-yet"))))
        await eventually(lambda: _holds(lambda: bool(said(caplog, f"a card of {agent.name}"))))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warned if "GPU-not-registered-yet" in m]
    assert [m for m in warned if agent.cards[0].uuid in m and f"a card of {agent.name}" in m]


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


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
