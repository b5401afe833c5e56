"""A node that comes back on a new driver segment (a reboot: the old one is gone) announces
its cards' present state at start, as one that adopted its segment does: a preemptor that
held a gang suspended for a card busy when the node went down frees it once that card is
heard idle, instead of holding it until high priority there runs again."""

from __future__ import annotations

import contextlib

import httpx
from nats.aio.client import Client as Nats

from qshare_driver.errors import NotFoundError
from qshare_preemptor.app import Preemptor

from .conftest import StartAgent, eventually
from .test_card_resync import _holds, gang_beside_high_priority, suspended


async def test_a_gang_held_for_a_card_busy_when_its_node_went_down_resumes_once_it_is_back(
    api: httpx.AsyncClient, nc: Nats, start_agent: StartAgent, preemptor: Preemptor
) -> None:
    """The preemptor serves the whole session: earlier tests' gangs may be held, or freed,
    meanwhile, so this test follows its own gang's claim (a count of 1 failed in CI: 2)."""
    assert preemptor.service is not None
    service = preemptor.service
    earlier = service.held_claims()
    agent = await start_agent(cards=2)
    client, other = await gang_beside_high_priority(api, agent)
    client.launch_begin()
    await eventually(lambda: _holds(lambda: suspended(agent, other)))
    await agent.stop()  # down while its card is busy: no idle reaches the preemptor
    with contextlib.suppress(NotFoundError):  # its segment went with the node
        client.detach()
    [gang] = service.held_claims() - earlier
    await start_agent(cards=2, name=agent.name)  # back, on a new segment
    await eventually(lambda: _holds(lambda: gang not in service.held_claims()))
