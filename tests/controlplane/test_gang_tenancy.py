"""A gang is one tenant's: a claim of another tenant that takes the same gang name does not
join it, so high priority busy on that tenant's card suspends nothing of the first."""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc
from qshare.contracts.agent import SuspendCommand, SuspendReply
from qshare_preemptor.service import PreemptionService
from tests.controlplane.conftest import Claim, Register


async def _suspended_on(nc: Client, engine: AsyncEngine, node: str, gpu: str) -> list[str]:
    """The nodes a busy event about `gpu` of `node` sent a suspend to."""
    seen: list[str] = []

    async def agent(msg: Msg) -> None:
        seen.append(msg.subject.split(".")[2])
        ids = envelope.decode(msg.data).payload(SuspendCommand).local_ids
        await rpc.reply_ok(nc, msg, "test-agent", SuspendReply(done=ids))

    sub = await nc.subscribe("qshare.node.*.cmd.suspend", cb=agent)
    await bus.settled(nc)
    try:
        service = PreemptionService(nc, engine, "test-preemptor", timeout_s=2.0)
        await service.card_event(node, gpu, busy=True)
    finally:
        await sub.unsubscribe()
    return seen


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
