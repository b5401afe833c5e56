"""Gangs in the preemptor: a gang is one tenant's (a claim of another tenant that takes the
same gang name does not join it, so high priority busy on that tenant's card suspends nothing
of the first), and an operator's resume leaves suspended the gang vGPUs a busy card holds (a
later busy card of the gang then suspends only what still runs)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc
from qshare.contracts.agent import SuspendCommand, SuspendReply
from qshare.contracts.preemption import ClaimAction
from qshare.contracts.schema import claims
from qshare_preemptor.service import PreemptionService
from tests.controlplane.conftest import Claim, Register

VERBS = ("suspend", "resume")


@asynccontextmanager
async def _agents(nc: Client, resumed: list[str] | None = None) -> AsyncIterator[list[str]]:
    """Every node's agent, answering suspends and resumes; yields the nodes suspended on
    (and notes in `resumed` those resumed on)."""
    seen: list[str] = []

    async def agent(msg: Msg) -> None:
        if msg.subject.endswith(".suspend"):
            seen.append(msg.subject.split(".")[2])
        elif resumed is not None:
            resumed.append(msg.subject.split(".")[2])
        ids = envelope.decode(msg.data).payload(SuspendCommand).local_ids
        await rpc.reply_ok(nc, msg, "test-agent", SuspendReply(done=ids))

    subs = [await nc.subscribe(f"qshare.node.*.cmd.{verb}", cb=agent) for verb in VERBS]
    await bus.settled(nc)
    try:
        yield seen
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def _suspended_on(nc: Client, engine: AsyncEngine, node: str, gpu: str) -> list[str]:
    """The nodes a busy event about `gpu` of `node` sent a suspend to."""
    async with _agents(nc) as suspended:
        service = PreemptionService(nc, engine, "test-preemptor", timeout_s=2.0)
        await service.card_event(node, gpu, busy=True)
    return suspended


async def claim_on(engine: AsyncEngine, node: str) -> uuid.UUID:
    async with engine.connect() as conn:
        query = select(claims.c.id).where(claims.c.node_name == node)
        return uuid.UUID(str((await conn.execute(query)).scalar_one()))


async def test_a_claim_of_another_tenant_with_the_same_gang_name_suspends_none_of_its_claims(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    await register("gang-a", cards=1, zone="a")
    await register("gang-b", cards=1, zone="b")
    await claim("team-a", priority="low", gang="train", node_selector={"zone": "a"})
    await claim("team-b", priority="low", gang="train", node_selector={"zone": "b"})
    assert await _suspended_on(nc, engine, "gang-b", "gang-b-g0") == []


async def test_a_busy_card_still_suspends_its_tenants_gang_on_its_other_cards(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    await register("gang-a", cards=1, zone="a")
    await register("gang-b", cards=1, zone="b")
    await claim("team-a", priority="low", gang="train", node_selector={"zone": "a"})
    await claim("team-a", priority="low", gang="train", node_selector={"zone": "b"})
    assert await _suspended_on(nc, engine, "gang-b", "gang-b-g0") == ["gang-a"]


async def test_an_operator_resume_leaves_suspended_a_gang_vgpu_a_busy_card_holds(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """Before, the operator's resume ran gang-b's vGPU while gang-a's card was busy (and a
    fix made the next busy card suspend it again); now it stays suspended until the gang's
    release, and the next busy card suspends only the vGPU on the first busy card."""
    for zone in ("a", "b", "d"):
        await register(f"gang-{zone}", cards=1, zone=zone)
    for zone in ("a", "b", "d"):
        await claim("team-a", priority="low", gang="train", node_selector={"zone": zone})
    held = await claim_on(engine, "gang-b")
    service = PreemptionService(nc, engine, "test-preemptor", timeout_s=2.0)
    resumed: list[str] = []
    async with _agents(nc, resumed) as suspended:
        await service.card_event("gang-a", "gang-a-g0", busy=True)
        reply = await service.operator(ClaimAction(claim_id=held), suspend=False)
        suspended.clear()
        await service.card_event("gang-d", "gang-d-g0", busy=True)
    assert (reply.vgpus, resumed, suspended) == (0, [], ["gang-a"])
