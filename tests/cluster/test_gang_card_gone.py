"""A gang held by a busy card that leaves the inventory (its node went down while the card
was busy, and an admin removed the node or the card) is let go: no idle event will ever come
for a card the inventory no longer has."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from qshare_driver import Client, DriverError
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor

from .conftest import Restarts, StartAgent, eventually, ready_claim


@dataclass
class Split:
    """Gang `g` of one tenant: claim `here` beside busy high priority on node `busy`'s one
    card, claim `there` on node `other`; `there` is suspended for the busy card."""

    busy: NodeAgent
    other: NodeAgent
    hp_gpu: str
    there: int
    hp: Client

    def there_suspended(self) -> bool:
        return self.other.node.vgpu_stats(self.there).suspended


@pytest.fixture
async def split(
    api: httpx.AsyncClient, start_agent: StartAgent, preemptor: Preemptor
) -> AsyncIterator[Split]:
    busy = await start_agent(cards=1, keep_segment_on_stop=True)  # its client detaches after
    await ready_claim(api, gang="g")
    hp = await ready_claim(api, priority="high", vcore=50, vmemory="14Gi")  # the card is full
    other = await start_agent(cards=1, keep_segment_on_stop=True)
    there = await ready_claim(api, gang="g")
    assert there["vgpus"][0]["node"] == other.name
    (vgpu,) = hp["vgpus"]
    attach = busy.settings.segment_name, vgpu["local_id"], busy.settings.shm_dir
    client = Client.attach(*attach)
    client.launch_begin()
    found = Split(busy, other, vgpu["gpu"], there["vgpus"][0]["local_id"], client)
    try:
        await eventually(lambda: _holds(found.there_suspended))
        yield found
    finally:
        with contextlib.suppress(DriverError):  # its node's agent was stopped
            client.detach()


async def test_a_gang_held_by_a_card_whose_node_is_removed_resumes(
    api: httpx.AsyncClient, split: Split
) -> None:
    """Before, it stayed suspended until the preemptor restarted."""
    await split.busy.stop()
    assert (await api.delete(f"/v1/nodes/{split.busy.name}")).status_code == 200
    await eventually(lambda: _holds(lambda: not split.there_suspended()), within_s=10)


async def test_a_gang_held_by_a_removed_card_resumes(api: httpx.AsyncClient, split: Split) -> None:
    await split.busy.stop()
    removed = await api.delete(f"/v1/nodes/{split.busy.name}/gpus/{split.hp_gpu}")
    assert removed.status_code == 200, removed.text
    await eventually(lambda: _holds(lambda: not split.there_suspended()), within_s=10)


async def _holds(check: Callable[[], bool]) -> bool:
    return check()


async def test_a_resume_owed_to_a_node_away_reaches_it_after_a_preemptor_restart(
    split: Split, restartable: Restarts, start_agent: StartAgent, preemptor: Preemptor
) -> None:
    """The gang's node stops (its segment kept: the suspension stays in the driver), its
    card's idle sends a resume that does not reach it, and the preemptor restarts before the
    node is back. Before, the resume owed was only in the old preemptor's memory and the
    gang's record was already ended: the vGPU stayed suspended for good."""
    await split.other.stop()
    assert preemptor.service is not None
    split.hp.launch_end()
    owed = preemptor.service
    await eventually(lambda: _holds(lambda: bool(owed.resumes_owed)), within_s=10)
    await restartable.stop()
    await restartable.start()
    back = await start_agent(cards=1, name=split.other.name, keep_segment_on_stop=False)
    await eventually(
        lambda: _holds(lambda: not back.node.vgpu_stats(split.there).suspended), within_s=10
    )
