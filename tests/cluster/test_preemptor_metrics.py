"""The preemptor's Prometheus `/metrics`: card events by outcome, suspend and resume commands
by outcome, and, read when scraped, the gangs it holds and the resumes it still owes (a resume
that cannot reach its node is owed until the node is back)."""

from __future__ import annotations

import httpx
from nats.aio.client import Client as Nats
from prometheus_client.parser import text_string_to_metric_families

from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor

from .conftest import StartAgent, eventually, ready_claim
from .test_preemptor_events import events_so_far, handled, publish, suspended


async def scraped(preemptor: Preemptor, name: str, **labels: str) -> float:
    """The value of one series on the preemptor's /metrics (0 when it is not there)."""
    url = f"http://127.0.0.1:{preemptor.settings.metrics_port}/metrics"
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def no_gang_held(preemptor: Preemptor) -> None:
    """Wait until the session's preemptor holds no earlier test's gang: each test empties
    the inventory, and the preemptor lets go (every second) the gangs held by cards gone
    from it, so a count read before that would drop in the middle of the test."""
    await eventually(lambda: _is(preemptor, "qshare_preemptor_claims_held", 0), 20)


async def counted(preemptor: Preemptor, name: str, value: float, **labels: str) -> None:
    """Wait until the series reaches `value`: the preemptor counts (and times) a command once
    it has read the node's answer, and the node suspends the vGPU the test sees before it
    answers, so the vGPU can show suspended before the command is counted."""

    async def reached() -> bool:
        return await scraped(preemptor, name, **labels) >= value

    await eventually(reached, 20)


async def _gang_held(api: httpx.AsyncClient, nc: Nats, agent: NodeAgent) -> tuple[str, int]:
    """A two-card gang on `agent` with one card busy: the busy card and the other's local id."""
    gang = await ready_claim(api, count=2)
    busy, other = gang["vgpus"]
    await publish(nc, agent.name, busy["gpu"], "busy")
    await eventually(lambda: _async(suspended(agent, other["local_id"])))
    return busy["gpu"], other["local_id"]


async def _async(value: bool) -> bool:
    return value


async def test_a_gang_held_by_a_busy_card_is_served_until_the_card_is_idle(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    await no_gang_held(preemptor)
    suspends = await scraped(
        preemptor, "qshare_preemptor_commands_total", verb="suspend", outcome="ok"
    )
    gpu, _ = await _gang_held(api, nc, agent)
    assert await scraped(preemptor, "qshare_preemptor_claims_held") == 1
    await counted(preemptor, "qshare_preemptor_commands_total", suspends + 1, verb="suspend",
                  outcome="ok")  # fmt: skip
    assert await scraped(preemptor, "qshare_preemptor_commands_total", verb="suspend",
                         outcome="ok") == suspends + 1  # fmt: skip
    await publish(nc, agent.name, gpu, "idle")
    await eventually(lambda: _is(preemptor, "qshare_preemptor_claims_held", 0))


async def test_each_commands_round_trip_to_its_node_is_timed(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    await no_gang_held(preemptor)
    timed = await scraped(preemptor, "qshare_preemptor_command_seconds_count", verb="suspend")
    gpu, _ = await _gang_held(api, nc, agent)
    await counted(preemptor, "qshare_preemptor_command_seconds_count", timed + 1, verb="suspend")
    assert await scraped(preemptor, "qshare_preemptor_command_seconds_count",
                         verb="suspend") == timed + 1  # fmt: skip
    await publish(nc, agent.name, gpu, "idle")
    await eventually(lambda: _is(preemptor, "qshare_preemptor_claims_held", 0))


async def _is(preemptor: Preemptor, name: str, value: float) -> bool:
    return await scraped(preemptor, name) == value


async def test_a_card_event_about_another_nodes_card_is_counted_as_refused(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    await start_agent(cards=2)
    gang = await ready_claim(api, count=2)
    refused = await scraped(preemptor, "qshare_preemptor_card_events_total", kind="busy",
                            outcome="refused")  # fmt: skip
    before = events_so_far(preemptor)
    await publish(nc, "some-other-node", gang["vgpus"][0]["gpu"], "busy")
    await handled(preemptor, before + 1)
    assert await scraped(preemptor, "qshare_preemptor_card_events_total", kind="busy",
                         outcome="refused") == refused + 1  # fmt: skip


async def test_a_resume_that_cannot_reach_its_node_is_owed_until_the_node_is_back(
    api: httpx.AsyncClient, nc: Nats, preemptor: Preemptor, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2, keep_segment_on_stop=True)
    gpu, other = await _gang_held(api, nc, agent)
    await agent.stop()
    await publish(nc, agent.name, gpu, "idle")
    await eventually(lambda: _owed(preemptor, agent.name, 1))
    back = await start_agent(cards=2, name=agent.name)  # adopts the segment and its vGPUs
    await eventually(lambda: _owed(preemptor, agent.name, 0))
    assert not suspended(back, other)


async def _owed(preemptor: Preemptor, node: str, count: int) -> bool:
    return await scraped(preemptor, "qshare_preemptor_resumes_owed", node=node) == count
