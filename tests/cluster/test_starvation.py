"""The starvation watch: node agents report device time per vGPU and card from the driver,
the preemptor finds low-priority claims that high priority leaves too little of their card,
reports them (event, `GET /v1/starvation`) and, where the class allows, has them moved to a
card with more harvestable time. High priority is made busy through the simulated card."""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.errors import InvalidInput
from qshare.contracts.usage import CardUsage, MoveClaim, MoveReply, NodeUsage
from qshare_driver import Client
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor

from .conftest import StartAgent, eventually, ready_claim

USAGE_INTERVAL_S = 0.2
SHARE = 0.3
_classes = itertools.count()


async def watched_class(api: httpx.AsyncClient, move: bool = False) -> str:
    name = f"starve-{uuid.uuid4().hex[:8]}-{next(_classes)}"
    body = {"name": name, "provisioner": "qshare", "starvation_share": SHARE,
            "move_on_starvation": move}  # fmt: skip
    response = await api.post("/v1/classes", json=body)
    assert response.status_code == 201, response.text
    return name


@contextlib.contextmanager
def busy(agent: NodeAgent, vgpu: dict[str, Any]) -> Iterator[None]:
    """High priority runs kernels back to back on `vgpu`'s card until the block ends."""
    stop = threading.Event()

    def work() -> None:
        with Client.attach(
            agent.settings.segment_name, vgpu["local_id"], agent.settings.shm_dir
        ) as c:
            while not stop.is_set():
                c.run_kernel(0.02)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


async def records(api: httpx.AsyncClient, claim: dict[str, Any]) -> list[dict[str, Any]]:
    response = await api.get("/v1/starvation", params={"claim": claim["id"]})
    assert response.status_code == 200, response.text
    return list(response.json())


async def reported(api: httpx.AsyncClient, claim: dict[str, Any]) -> bool:
    return bool(await records(api, claim))


async def start_reporting(start_agent: StartAgent, cards: int) -> NodeAgent:
    return await start_agent(cards=cards, usage_interval_s=USAGE_INTERVAL_S)


async def test_the_node_agent_reports_high_priority_device_time_of_its_card(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_reporting(start_agent, cards=2)
    hp = await ready_claim(api, priority="high", vcore=50)
    seen: list[NodeUsage] = []

    async def note(msg: Msg) -> None:
        seen.append(envelope.decode(msg.data).payload(NodeUsage))

    sub = await nc.subscribe(subjects.usage(agent.name), cb=note)
    with busy(agent, hp["vgpus"][0]):
        await eventually(lambda: _holds(any(_hp_ns(u, hp["vgpus"][0]["gpu"]) > 0 for u in seen)))
    await sub.unsubscribe()
    other = next(c.uuid for c in agent.cards if c.uuid != hp["vgpus"][0]["gpu"])
    assert all(_hp_ns(u, other) == 0 for u in seen)


async def test_a_low_priority_claim_starved_by_busy_high_priority_on_its_card_is_reported(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_reporting(start_agent, cards=1)
    lp = await ready_claim(api, class_name=await watched_class(api))
    hp = await ready_claim(api, priority="high", vcore=50)
    seen: list[str] = []

    async def note(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe(subjects.claim_event(lp["id"], "starved"), cb=note)
    with busy(agent, hp["vgpus"][0]):
        await eventually(lambda: reported(api, lp))
        await eventually(lambda: _holds(bool(seen)))
    await sub.unsubscribe()
    [record] = await records(api, lp)
    assert (record["gpu"], record["open"]) == (lp["vgpus"][0]["gpu"], True)
    assert record["harvestable_share"] < SHARE


async def test_a_starved_claim_fed_again_has_its_record_closed(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_reporting(start_agent, cards=1)
    lp = await ready_claim(api, class_name=await watched_class(api))
    hp = await ready_claim(api, priority="high", vcore=50)
    with busy(agent, hp["vgpus"][0]):
        await eventually(lambda: reported(api, lp))
    await eventually(lambda: _closed(api, lp))
    [record] = await records(api, lp)
    assert record["moved_to"] is None


async def test_a_low_priority_claim_on_an_idle_card_is_not_reported(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_reporting(start_agent, cards=2)
    watched = await watched_class(api)
    first = await ready_claim(api, class_name=watched)
    second = await ready_claim(api, class_name=watched)
    hp = await ready_claim(api, priority="high", vcore=50)
    beside, alone = (first, second) if _gpu(first) == _gpu(hp) else (second, first)
    assert _gpu(alone) != _gpu(hp)
    with busy(agent, hp["vgpus"][0]):
        await eventually(lambda: reported(api, beside))
    assert await records(api, alone) == []


async def test_a_starved_claim_whose_class_allows_it_moves_to_an_idle_card(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_reporting(start_agent, cards=2)
    lp = await ready_claim(api, class_name=await watched_class(api, move=True))
    hp = await ready_claim(api, priority="high", vcore=50)
    assert _gpu(lp) == _gpu(hp), "HP seeks the card with LP work on it"
    events = await nc.subscribe(subjects.claim_event(lp["id"], "moved"))
    with busy(agent, hp["vgpus"][0]):
        await eventually(lambda: _moved_and_ready(api, lp["id"], away_from=_gpu(hp)), 30)
    assert (await events.next_msg(timeout=20)).subject.endswith(".moved")
    [record] = await records(api, lp)
    moved = (await api.get(f"/v1/claims/{lp['id']}")).json()
    assert (record["open"], record["moved_to"]) == (False, _gpu(moved))


async def test_a_starved_claim_stays_when_no_card_has_more_harvestable_time(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_reporting(start_agent, cards=2)
    lp = await ready_claim(api, class_name=await watched_class(api, move=True))
    hp_a = await ready_claim(api, priority="high", vcore=50)
    hp_b = await ready_claim(api, priority="high", vcore=50)
    assert {_gpu(hp_a), _gpu(hp_b)} == {c.uuid for c in agent.cards}
    with busy(agent, hp_a["vgpus"][0]), busy(agent, hp_b["vgpus"][0]):
        await eventually(lambda: _noted(api, lp))
    [record] = await records(api, lp)
    assert record["moved_to"] is None
    assert "no card with more harvestable time" in record["note"]
    assert _gpu((await api.get(f"/v1/claims/{lp['id']}")).json()) == _gpu(lp)


async def test_the_allocator_never_moves_a_high_priority_claim(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_agent(cards=2)
    hp = await ready_claim(api, priority="high", vcore=50)
    other = next(c.uuid for c in agent.cards if c.uuid != _gpu(hp))
    command = MoveClaim(claim_id=hp["id"], from_gpu=_gpu(hp), to_gpus=[other])
    with pytest.raises(InvalidInput, match="high-priority claim is never moved"):
        await rpc.call(nc, subjects.CLAIMS_MOVE, "test", command, MoveReply)
    assert _gpu((await api.get(f"/v1/claims/{hp['id']}")).json()) == _gpu(hp)


async def test_the_allocator_does_not_move_a_claim_whose_class_does_not_allow_it(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_agent(cards=2)
    lp = await ready_claim(api, class_name=await watched_class(api, move=False))
    other = next(c.uuid for c in agent.cards if c.uuid != _gpu(lp))
    command = MoveClaim(claim_id=lp["id"], from_gpu=_gpu(lp), to_gpus=[other])
    reply = await rpc.call(nc, subjects.CLAIMS_MOVE, "test", command, MoveReply)
    assert reply.moved_to is None
    assert "does not allow moving" in reply.reason


async def test_malformed_and_forged_usage_reports_are_refused_and_the_watch_goes_on(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats, preemptor: Preemptor
) -> None:
    agent = await start_reporting(start_agent, cards=1)
    other = await start_agent(cards=1)
    watch = preemptor.starvation
    assert watch is not None
    refused = watch.refused
    subject = subjects.usage(agent.name)
    await nc.publish(subject, b"not json")
    await nc.publish(subject, _usage(other.name, other.cards[0].uuid))
    await nc.publish(subject, _usage(agent.name, other.cards[0].uuid))
    await eventually(lambda: _holds(watch.refused == refused + 3))
    assert other.cards[0].uuid not in watch.cards
    taken = watch.taken
    await eventually(lambda: _holds(watch.taken > taken + 1))
    assert agent.cards[0].uuid in watch.cards


async def test_a_class_with_a_starvation_share_above_one_is_refused(
    api: httpx.AsyncClient,
) -> None:
    body = {"name": f"bad-{uuid.uuid4().hex[:8]}", "provisioner": "qshare",
            "starvation_share": 1.5}  # fmt: skip
    response = await api.post("/v1/classes", json=body)
    assert response.status_code == 422
    assert "starvation_share" in response.text


def _usage(node: str, gpu: str) -> bytes:
    body = NodeUsage(node=node, interval_ns=10**9, cards=[CardUsage(gpu=gpu, hp_ns=10**9)])
    return envelope.encode(envelope.wrap("forger", "io.qshare.node.usage", body))


def _hp_ns(usage: NodeUsage, gpu: str) -> int:
    return sum(c.hp_ns for c in usage.cards if c.gpu == gpu)


def _gpu(claim: dict[str, Any]) -> str:
    return str(claim["vgpus"][0]["gpu"])


async def _moved_and_ready(api: httpx.AsyncClient, claim_id: str, away_from: str) -> bool:
    claim = (await api.get(f"/v1/claims/{claim_id}")).json()
    return bool(claim["status"] == "ready" and claim["vgpus"] and _gpu(claim) != away_from)


async def _closed(api: httpx.AsyncClient, claim: dict[str, Any]) -> bool:
    return all(not r["open"] for r in await records(api, claim))


async def _noted(api: httpx.AsyncClient, claim: dict[str, Any]) -> bool:
    return any(r["note"] for r in await records(api, claim))


async def _holds(value: bool) -> bool:
    return value
