"""A claim the control plane holds suspended stays suspended when its node comes back from a
reboot on a new driver segment (the driver creates every vGPU running; the allocator's apply
carries the hold), and a vGPU runs only once nothing holds it: neither an operator nor a busy
card of its gang. Real agents on simulated cards, real Postgres and NATS."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as Nats
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.agent import ApplyReply
from qshare.contracts.domain import NODE_LABEL
from qshare.db import read_once
from qshare_allocator.nodes.desired import desired_state
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor

from .conftest import StartAgent, eventually, ready_claim
from .test_preemptor_events import publish


@pytest.fixture
def fresh_shm() -> Iterator[Path]:
    """An empty segment directory for the node back from its reboot, under /tmp: a driver
    socket's path must fit a unix address (108 bytes), which a test's tmp_path may not."""
    directory = Path(tempfile.mkdtemp(prefix="qsr-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def reboot(agent: NodeAgent, bus_url: str, shm_dir: Path) -> NodeAgent:
    """Stop `agent` (its segment removed) and start it again on a new segment directory, as a
    node back from a reboot (an empty /dev/shm)."""
    await agent.stop()
    back = NodeAgent(agent.settings.model_copy(update={"shm_dir": shm_dir}))
    await back.start()
    await asyncio.wait_for(back.registered.wait(), 20)
    return back


async def created(agent: NodeAgent, local_id: int) -> None:
    """Wait until an apply made the vGPU `local_id` (a vGPU is in `applied` once done with)."""
    await eventually(lambda: _holds(lambda: local_id in agent.applied))


def suspended(agent: NodeAgent, local_id: int) -> bool:
    return agent.node.vgpu_stats(local_id).suspended


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()


async def test_an_operator_suspension_outlives_a_reboot_until_resumed(
    api: httpx.AsyncClient, bus_url: str, start_agent: StartAgent, fresh_shm: Path,
    preemptor: Preemptor,
) -> None:  # fmt: skip
    """Before, the node came back with the claim's vGPU running while the API said it was
    suspended by the operator."""
    agent = await start_agent(cards=1)
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    assert suspended(agent, local_id)
    back = await reboot(agent, bus_url, fresh_shm)
    try:
        await created(back, local_id)
        assert suspended(back, local_id)
        assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
        await eventually(lambda: _holds(lambda: not suspended(back, local_id)))
    finally:
        await back.stop()


async def test_a_gang_held_by_another_nodes_busy_card_stays_suspended_after_a_reboot(
    api: httpx.AsyncClient, nc: Nats, bus_url: str, start_agent: StartAgent, fresh_shm: Path,
    preemptor: Preemptor,
) -> None:  # fmt: skip
    """A gang across two nodes: high priority busy on the first node's card holds the gang's
    vGPU on the second node, which reboots; before, it came back running."""
    first = await start_agent(cards=1)
    second = await start_agent(cards=1)
    gang = f"train-{os.getpid()}"
    on_first = await ready_claim(api, gang=gang, node_selector={NODE_LABEL: first.name})
    on_second = await ready_claim(api, gang=gang, node_selector={NODE_LABEL: second.name})
    busy = on_first["vgpus"][0]["gpu"]
    held = on_second["vgpus"][0]["local_id"]
    await publish(nc, first.name, busy, "busy")
    await eventually(lambda: _holds(lambda: suspended(second, held)))
    back = await reboot(second, bus_url, fresh_shm)
    try:
        await created(back, held)
        assert suspended(back, held)
        await publish(nc, first.name, busy, "idle")
        await eventually(lambda: _holds(lambda: not suspended(back, held)))
    finally:
        await back.stop()


async def test_an_operator_resume_leaves_suspended_what_a_busy_gang_card_holds(
    api: httpx.AsyncClient, nc: Nats, start_agent: StartAgent, preemptor: Preemptor
) -> None:
    """Before, the operator's resume ran every vGPU of the claim while the card high priority
    needed was still busy; now the one on the other card waits for the card to go idle."""
    agent = await start_agent(cards=2)
    claim = await ready_claim(api, count=2)
    busy, other = claim["vgpus"]
    await publish(nc, agent.name, busy["gpu"], "busy")
    await eventually(lambda: _holds(lambda: suspended(agent, other["local_id"])))
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
    assert suspended(agent, other["local_id"])
    view = (await api.get(f"/v1/claims/{claim['id']}")).json()
    assert view["suspended"]["kind"] == "gang"
    await publish(nc, agent.name, busy["gpu"], "idle")
    await eventually(lambda: _holds(lambda: not suspended(agent, other["local_id"])))


async def test_an_apply_read_before_a_resume_and_taken_after_it_is_set_right(
    api: httpx.AsyncClient, nc: Nats, engine: AsyncEngine, start_agent: StartAgent,
    preemptor: Preemptor,
) -> None:  # fmt: skip
    """An apply the allocator read while the claim was suspended reaches the agent after the
    operator's resume (sent here by hand, as a slow one would arrive): the preemptor gave the
    node a new generation with the resume, so a later apply resumes the vGPU again. Before,
    nothing sent another apply and the claim stayed suspended after its resume."""
    agent = await start_agent(cards=1)
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    late = await read_once(engine, lambda conn: desired_state(conn, agent.name))
    assert late is not None and late.vgpus[0].suspended
    assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
    subject = subjects.node_command(agent.name, "apply")
    await rpc.call(nc, subject, "test-allocator", late, ApplyReply, timeout=5.0)
    await eventually(lambda: _holds(lambda: not suspended(agent, local_id)))
