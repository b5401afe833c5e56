"""Deleting a claim: `releasing` until its node confirms the vGPUs left the segment, then
`released`; released anyway (with the reason) when the node does not confirm in time, and
at once on a node without an agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
from nats.aio.client import Client
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import envelope
from qshare_allocator.app import Allocator
from qshare_driver import NotFoundError
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import StartAgent, allocator_settings, create_claim, eventually, ready_claim


class ClaimEvents:
    """The kinds of one claim's events in arrival order, each with its data; `on_released`
    is called as the `released` event arrives."""

    def __init__(self, on_released: Callable[[], object] = lambda: None) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.at_released: list[object] = []
        self._on_released = on_released

    async def handle(self, msg: Msg) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        if kind == "released":
            self.at_released.append(self._on_released())
        self.seen.append((kind, envelope.decode(msg.data).data or {}))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.seen]

    async def released(self) -> bool:
        return "released" in self.kinds()

    def released_reason(self) -> str:
        return str(dict(self.seen)["released"]["reason"])


async def watch(
    nc: Client, claim_id: str, on_released: Callable[[], object] = lambda: None
) -> ClaimEvents:
    events = ClaimEvents(on_released)
    await nc.subscribe(f"qshare.evt.claim.{claim_id}.>", cb=events.handle)
    await bus.settled(nc)
    return events


def held_by_segment(agent: NodeAgent, local_id: int) -> bool:
    """Whether the agent still holds the vGPU, or its driver segment still has it."""
    if local_id in agent.applied:
        return True
    try:
        agent.node.vgpu_stats(local_id)
    except NotFoundError:
        return False
    return True


async def test_a_deleted_claim_is_releasing_until_its_vgpu_has_left_the_segment(
    api: httpx.AsyncClient, nc: Client, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    events = await watch(nc, claim["id"], lambda: held_by_segment(agent, local_id))
    deleted = await api.delete(f"/v1/claims/{claim['id']}")
    assert deleted.json()["status"] == "releasing", deleted.text
    await eventually(events.released)
    assert [k for k in events.kinds() if k.startswith("releas")] == ["releasing", "released"]
    assert events.at_released == [False]


async def stopped_after_a_ready_claim(
    api: httpx.AsyncClient, bus_url: str, shm: Path, **spec: Any
) -> str:
    """A node whose agent made a claim (of `spec`) ready and then stopped (the node is not
    NotReady yet: that takes `node_timeout_s`); returns the node's name."""
    settings = NodeAgentSettings(
        name=f"silent-{os.getpid()}", nats_url=bus_url, simulate="1:16Gi", shm_dir=shm,
        heartbeat_s=0.5, keep_segment_on_stop=False,
    )  # fmt: skip
    agent = NodeAgent(settings)
    await agent.start()
    try:
        await asyncio.wait_for(agent.registered.wait(), 20)
        await ready_claim(api, **spec)
    finally:
        await agent.stop()
    return settings.name


async def releasing_on_a_stopped_node(
    api: httpx.AsyncClient, nc: Client, bus_url: str, shm: Path
) -> tuple[str, ClaimEvents]:
    """A ready claim on a node whose agent then stopped, deleted (so `releasing`, with no
    agent left to confirm): the node's name and the claim's events."""
    name = await stopped_after_a_ready_claim(api, bus_url, shm)
    claim = (await api.get("/v1/claims", params={"node": name})).json()["items"][0]
    events = await watch(nc, claim["id"])
    deleted = await api.delete(f"/v1/claims/{claim['id']}")
    assert deleted.json()["status"] == "releasing", deleted.text
    return name, events


async def test_deleting_a_releasing_claim_again_returns_it_still_releasing(
    api: httpx.AsyncClient, bus_url: str, tmp_path: Path
) -> None:
    name = await stopped_after_a_ready_claim(api, bus_url, tmp_path)
    claim = (await api.get("/v1/claims", params={"node": name})).json()["items"][0]
    first = await api.delete(f"/v1/claims/{claim['id']}")
    second = await api.delete(f"/v1/claims/{claim['id']}")
    assert (first.json()["status"], second.status_code) == ("releasing", 200)
    assert second.json()["status"] == "releasing"


@contextlib.asynccontextmanager
async def impatient_allocator(database_url: str, bus_url: str) -> AsyncIterator[Allocator]:
    """A second replica that gives a node 0.5 s to confirm (started once the claim is
    ready, so its impatience fails no claim on its way to ready)."""
    settings = allocator_settings(database_url, bus_url, f"impatient-{os.getpid()}")
    async with Allocator(settings.model_copy(update={"apply_timeout_s": 0.5})) as running:
        yield running


async def test_a_claim_whose_stopped_agent_never_confirms_is_released_with_the_reason(
    api: httpx.AsyncClient, nc: Client, database_url: str, bus_url: str, tmp_path: Path
) -> None:
    name, events = await releasing_on_a_stopped_node(api, nc, bus_url, tmp_path)
    async with impatient_allocator(database_url, bus_url):
        await eventually(events.released)
    reason = events.released_reason()
    assert reason == f"node {name} did not confirm the removal of the vGPUs within 0.5 s"


async def test_a_claim_on_a_node_without_an_agent_is_released_at_once(
    api: httpx.AsyncClient,
) -> None:
    card = {"uuid": f"bare-{os.getpid()}-g0", "index": 0, "model": "A100", "memory": "16Gi"}
    body = {"name": f"bare-{os.getpid()}", "gpus": [card]}
    assert (await api.post("/v1/nodes", json=body)).status_code == 200
    created = await api.post("/v1/claims", json={"priority": "low", "vcore": 20, "vmemory": "2Gi"})
    assert created.json()["status"] == "placed", created.text
    deleted = await api.delete(f"/v1/claims/{created.json()['id']}")
    assert deleted.json()["status"] == "released", deleted.text


async def test_a_pending_claim_is_released_at_once(api: httpx.AsyncClient) -> None:
    created = await create_claim(api)
    assert created["status"] == "pending", created
    deleted = await api.delete(f"/v1/claims/{created['id']}")
    assert deleted.json()["status"] == "released", deleted.text


async def test_a_claim_held_on_a_not_ready_node_is_released_at_once(
    api: httpx.AsyncClient, bus_url: str, tmp_path: Path
) -> None:
    stays = {"name": f"stays-{uuid.uuid4().hex[:8]}", "provisioner": "qshare",
             "replace_on_failure": False}  # fmt: skip
    assert (await api.post("/v1/classes", json=stays)).status_code == 201
    name = await stopped_after_a_ready_claim(api, bus_url, tmp_path, class_name=stays["name"])
    claim = (await api.get("/v1/claims", params={"node": name})).json()["items"][0]

    async def not_ready() -> bool:
        return bool((await api.get(f"/v1/nodes/{name}")).json()["status"] == "NotReady")

    await eventually(not_ready)
    deleted = await api.delete(f"/v1/claims/{claim['id']}")
    assert deleted.json()["status"] == "released", deleted.text


async def test_a_releasing_claim_whose_node_goes_not_ready_is_released_with_the_reason(
    api: httpx.AsyncClient, nc: Client, bus_url: str, tmp_path: Path
) -> None:
    name, events = await releasing_on_a_stopped_node(api, nc, bus_url, tmp_path)
    await eventually(events.released)  # the node timeout (3 s) comes before the apply's (10 s)
    reason = events.released_reason()
    assert reason == f"node {name} is NotReady; it removes the vGPUs when it is back"


async def test_a_releasing_claim_on_a_removed_node_is_released_with_the_reason(
    api: httpx.AsyncClient, nc: Client, bus_url: str, tmp_path: Path
) -> None:
    name, events = await releasing_on_a_stopped_node(api, nc, bus_url, tmp_path)
    assert (await api.delete(f"/v1/nodes/{name}")).status_code == 200
    await eventually(events.released)
    assert events.released_reason() == f"node {name} was removed"
