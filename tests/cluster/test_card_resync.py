"""Card busy/idle states are levels the preemptor reads again, not only edges it must catch:
it asks every node agent for its cards' present state (`qshare.nodes.announce`) when it
starts and whenever it reconnects to NATS, so a gang whose card went idle or busy while the
preemptor was away converges; an agent answers a burst of requests with a bounded number of
events. The preemptor here is the session's, restarted (through a TCP proxy to NATS where a
test cuts its connection) and restored to its settings afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import envelope, subjects
from qshare.contracts.agent import AnnounceRequest
from qshare.testing.tcp_proxy import TcpProxy
from qshare_driver import Client
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor

from .conftest import Restarts, StartAgent, eventually, ready_claim


@pytest.fixture
async def partitioned(preemptor: Preemptor, bus_url: str) -> AsyncIterator[TcpProxy]:
    """The session's preemptor, restarted to reach NATS through a proxy the test can cut."""
    settings = preemptor.settings
    async with TcpProxy(bus_url) as proxy:
        await preemptor.stop()
        settings.nats_url, settings.nats_reconnect_wait_s = proxy.url, 0.1
        await preemptor.start()
        try:
            yield proxy
        finally:
            await preemptor.stop()
            settings.nats_url, settings.nats_reconnect_wait_s = bus_url, 2.0
            await preemptor.start()


async def gang_beside_high_priority(api: httpx.AsyncClient, agent: NodeAgent) -> tuple[Client, int]:
    """A low-priority gang of two cards and a high-priority claim on one of them: the
    high-priority client (attached) and the gang's vGPU on the other card."""
    gang = await ready_claim(api, count=2)
    hp = (await ready_claim(api, priority="high", vcore=50))["vgpus"][0]
    other = next(v for v in gang["vgpus"] if v["gpu"] != hp["gpu"])
    client = Client.attach(agent.settings.segment_name, hp["local_id"], agent.settings.shm_dir)
    return client, other["local_id"]


class CardEvents:
    """The busy/idle events one node publishes, as a subscriber sees them."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def note(self, msg: Msg) -> None:
        self.kinds.append(subjects.parse_gpu_event(msg.subject)[2])

    def count(self, kind: str) -> int:
        return self.kinds.count(kind)


@pytest.fixture
async def agent_events(
    nc: Nats, start_agent: StartAgent
) -> AsyncIterator[tuple[NodeAgent, CardEvents]]:
    agent = await start_agent(cards=2, announce_interval_s=0.5)
    events = CardEvents()
    sub = await nc.subscribe(subjects.gpu_event(agent.name, "*", "*"), cb=events.note)
    await bus.settled(nc)
    yield agent, events
    await sub.unsubscribe()


async def test_an_idle_missed_while_disconnected_resumes_the_gang_once_the_preemptor_reconnects(
    api: httpx.AsyncClient, partitioned: TcpProxy, agent_events: tuple[NodeAgent, CardEvents]
) -> None:
    await _idle_while_away(api, agent_events, partitioned.cut, _as_coroutine(partitioned.restore))


async def test_a_restarted_preemptor_resumes_a_gang_whose_card_went_idle_while_it_was_down(
    api: httpx.AsyncClient, restartable: Restarts, agent_events: tuple[NodeAgent, CardEvents]
) -> None:
    await _idle_while_away(api, agent_events, restartable.stop, restartable.start)


async def test_a_restarted_preemptor_keeps_a_gang_suspended_while_its_card_is_still_busy(
    api: httpx.AsyncClient, restartable: Restarts, agent_events: tuple[NodeAgent, CardEvents]
) -> None:
    agent, _ = agent_events
    client, other = await gang_beside_high_priority(api, agent)
    with client:
        client.launch_begin()
        await eventually(lambda: _holds(lambda: suspended(agent, other)))
        await restartable.stop()
        await restartable.start()
        await handled_both_cards(restartable.preemptor)
        assert suspended(agent, other)
        client.launch_end()  # the restarted preemptor knows which card holds the gang
        await eventually(lambda: _holds(lambda: not suspended(agent, other)))


async def test_a_restarted_preemptor_suspends_a_gang_whose_card_went_busy_while_it_was_down(
    api: httpx.AsyncClient, restartable: Restarts, agent_events: tuple[NodeAgent, CardEvents]
) -> None:
    agent, events = agent_events
    client, other = await gang_beside_high_priority(api, agent)
    with client:
        await restartable.stop()
        client.launch_begin()
        await eventually(lambda: _holds(lambda: events.count("busy") >= 1))
        await restartable.start()
        await eventually(lambda: _holds(lambda: suspended(agent, other)))
        client.launch_end()
        await eventually(lambda: _holds(lambda: not suspended(agent, other)))


async def test_a_burst_of_announce_requests_makes_at_most_two_announcements(
    nc: Nats, start_agent: StartAgent
) -> None:
    """Its agent announces at most every 2 s (not the other tests' 0.5 s), so that the burst
    of 20 requests falls within one interval on a loaded machine too."""
    agent = await start_agent(cards=2, announce_interval_s=2.0)
    events = CardEvents()
    await nc.subscribe(subjects.gpu_event(agent.name, "*", "*"), cb=events.note)
    await bus.settled(nc)
    assert agent.announcer is not None
    announcer = agent.announcer
    await eventually(lambda: _holds(lambda: announcer.due_in() == 0))  # past the start's own
    for _ in range(20):
        await ask_announce(nc)
    await eventually(lambda: _holds(lambda: announcer.requests >= 20))
    await eventually(lambda: _holds(lambda: announcer.announcements >= 2))
    await eventually(lambda: _holds(lambda: len(events.kinds) >= 4))
    await ask_announce(nc)  # one more, after the burst, is still answered
    await eventually(lambda: _holds(lambda: len(events.kinds) >= 6))
    assert (announcer.announcements, events.kinds) == (3, ["idle"] * 6)


async def test_a_malformed_announce_request_announces_nothing(
    nc: Nats, agent_events: tuple[NodeAgent, CardEvents]
) -> None:
    agent, events = agent_events
    assert agent.announcer is not None
    announcer = agent.announcer
    await nc.publish(subjects.NODES_ANNOUNCE, b"not json")
    await ask_announce(nc)
    await eventually(lambda: _holds(lambda: len(events.kinds) >= 2))
    assert (announcer.requests, announcer.announcements) == (1, 1)


async def ask_announce(nc: Nats) -> None:
    body = envelope.wrap("test", "io.qshare.nodes.announce", AnnounceRequest(reason="test"))
    await nc.publish(subjects.NODES_ANNOUNCE, envelope.encode(body))


async def handled_both_cards(preemptor: Preemptor) -> None:
    """Wait until the (re)started preemptor handled the two cards' announced states."""
    assert preemptor.service is not None
    service = preemptor.service
    await eventually(lambda: _holds(lambda: service.card_events >= 2))


def suspended(agent: NodeAgent, local_id: int) -> bool:
    return agent.node.vgpu_stats(local_id).suspended


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()


async def _idle_while_away(
    api: httpx.AsyncClient,
    agent_events: tuple[NodeAgent, CardEvents],
    leave: Callable[[], Awaitable[None]],
    come_back: Callable[[], Awaitable[None]],
) -> None:
    """HP holds an LP gang suspended; the preemptor leaves, the card goes idle unheard, the
    preemptor comes back, and the gang resumes."""
    agent, events = agent_events
    client, other = await gang_beside_high_priority(api, agent)
    with client:
        client.launch_begin()
        await eventually(lambda: _holds(lambda: suspended(agent, other)))
        await leave()
        client.launch_end()  # the card goes idle, and no preemptor hears it
        await eventually(lambda: _holds(lambda: events.count("idle") >= 1))
        await come_back()
        await eventually(lambda: _holds(lambda: not suspended(agent, other)))


def _as_coroutine(act: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        act()

    return run
