"""High priority preempts low priority through the whole loop: the driver stops LP on the
busy card, the preemptor stops the rest of an LP gang, events reach a subscriber, and an
operator can suspend and resume a claim."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare_driver import Client
from qshare_node_agent.app import NodeAgent

from .conftest import ADMIN_TOKEN, StartAgent, eventually, ready_claim


def suspended(agent: NodeAgent, local_id: int) -> bool:
    return agent.node.vgpu_stats(local_id).suspended


def attach(agent: NodeAgent, vgpu: dict[str, Any]) -> Client:
    return Client.attach(agent.settings.segment_name, vgpu["local_id"], agent.settings.shm_dir)


async def test_high_priority_busy_on_one_card_suspends_the_gang_on_the_other(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await gang_follows_high_priority(api, await start_agent(cards=2))


async def gang_follows_high_priority(api: httpx.AsyncClient, agent: NodeAgent) -> None:
    """A two-card LP gang is suspended on the card HP does not use while HP is busy on the
    other, and resumed once HP is idle."""
    gang = await ready_claim(api, count=2)
    hp = await ready_claim(api, priority="high", vcore=50)
    other = next(v for v in gang["vgpus"] if v["gpu"] != hp["vgpus"][0]["gpu"])
    with attach(agent, hp["vgpus"][0]) as client:
        client.launch_begin()
        await eventually(lambda: _holds(suspended(agent, other["local_id"])))
        client.launch_end()
        await eventually(lambda: _holds(not suspended(agent, other["local_id"])))


async def test_a_subscriber_sees_busy_and_the_gangs_suspension(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_agent(cards=2)
    gang = await ready_claim(api, count=2)
    hp = await ready_claim(api, priority="high", vcore=50)
    seen: list[str] = []

    async def note(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe("qshare.evt.>", cb=note)
    await bus.settled(nc)
    with attach(agent, hp["vgpus"][0]) as client:
        client.launch_begin()
        await eventually(lambda: _holds(f"qshare.evt.claim.{gang['id']}.suspended" in seen))
        client.launch_end()
    await sub.unsubscribe()
    assert f"qshare.evt.gpu.{agent.name}.{hp['vgpus'][0]['gpu']}.busy" in seen


async def test_an_operator_suspends_and_resumes_a_claim(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    response = await api.post(f"/v1/claims/{claim['id']}/suspend")
    assert response.status_code == 200, response.text
    assert suspended(agent, local_id)
    assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
    assert not suspended(agent, local_id)


async def test_an_operator_suspension_is_recorded_with_its_length(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent()
    claim = await ready_claim(api)
    await api.post(f"/v1/claims/{claim['id']}/suspend")
    await api.post(f"/v1/claims/{claim['id']}/resume")
    records = (await api.get("/v1/preemptions", params={"claim": claim["id"]})).json()
    assert [(r["kind"], r["seconds"] is not None) for r in records] == [("operator", True)]


async def test_an_operator_suspension_of_a_deleted_claim_is_recorded_as_ended(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    """A suspended claim deleted without a resume (which a claim gone can no longer get):
    before, its record stayed open for good, and `GET /v1/preemptions` showed a released
    claim suspended."""
    await start_agent()
    claim = await ready_claim(api)
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    assert (await api.delete(f"/v1/claims/{claim['id']}")).status_code == 200

    async def ended() -> bool:
        response = await api.get("/v1/preemptions", params={"claim": claim["id"]})
        return [(r["kind"], r["ended_at"] is not None) for r in response.json()] == [
            ("operator", True)
        ]

    await eventually(ended)


EVENT = json.dumps({"specversion": "1.0", "id": "x", "source": "test", "type": "t", "data": {}})


@contextlib.asynccontextmanager
async def event_stream(api_url: str) -> AsyncIterator[tuple[list[str], asyncio.Task[None]]]:
    """`GET /v1/events` read into a list of lines by a task, cancelled on exit."""
    lines: list[str] = []
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def read() -> None:
        async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=None) as http, \
                http.stream("GET", "/v1/events") as response:  # fmt: skip
            async for line in response.aiter_lines():
                lines.append(line)

    reader = asyncio.create_task(read())
    try:
        yield lines, reader
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def test_events_reach_a_server_sent_event_stream(api_url: str, nc: Nats) -> None:
    async with event_stream(api_url) as (lines, _reader):

        async def seen() -> bool:
            """Publish until the stream shows it: the stream subscribes once its request
            arrives."""
            await nc.publish("qshare.evt.test.ping", EVENT.encode())
            await asyncio.sleep(0.1)
            return "event: qshare.evt.test.ping" in lines

        await eventually(seen, 20)


async def test_an_event_that_is_not_json_is_left_out_and_the_stream_goes_on(
    api_url: str, nc: Nats
) -> None:
    async with event_stream(api_url) as (lines, reader):

        async def seen() -> bool:
            await nc.publish("qshare.evt.test.garbage", b"\xff not json")
            await nc.publish("qshare.evt.test.after", EVENT.encode())
            await asyncio.sleep(0.1)
            return "event: qshare.evt.test.after" in lines

        await eventually(seen, 20)
        assert "event: qshare.evt.test.garbage" not in lines and not reader.done()


async def _holds(value: bool) -> bool:
    return value
