"""The preemptor believes a card event only from the node that holds the card now: a node
the card was taken from (removed there, registered on another node since) cannot go on
suspending or resuming gangs through it, even after its events about the card were
believed while it held it."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import SuspendCommand, SuspendReply
from qshare.contracts.nodes import NodeRegistration, NodeView, RemovalReply, RemoveCard
from qshare.contracts.usage import CardUsage, NodeUsage
from qshare_preemptor.service import PreemptionService
from qshare_preemptor.starvation import StarvationWatch
from tests.controlplane.conftest import Claim, Register, card

MOVED = "moved-card"
AGED_S = 2.5
"""Longer than the preemptor trusts what it read of a card's node."""


async def _register(nc: Client, node: str, zone: str) -> None:
    registration = NodeRegistration.model_validate(
        {"name": node, "labels": {"zone": zone}, "gpus": [card(MOVED, 0)]}
    )
    await rpc.call(nc, subjects.NODES_REGISTER, "test", registration, NodeView)


async def _remove(nc: Client, node: str) -> None:
    await rpc.call(
        nc, subjects.GPUS_DELETE, "test", RemoveCard(node=node, uuid=MOVED), RemovalReply
    )


async def test_a_node_the_card_was_taken_from_cannot_suspend_gangs_through_it(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    suspended: list[str] = []

    async def agent(msg: Msg) -> None:
        suspended.append(msg.subject.split(".")[2])
        ids = envelope.decode(msg.data).payload(SuspendCommand).local_ids
        await rpc.reply_ok(nc, msg, "test-agent", SuspendReply(done=ids))

    service = PreemptionService(nc, engine, "test-preemptor", timeout_s=2.0)
    await _register(nc, "old-home", "old")
    await service.card_event("old-home", MOVED, busy=False)  # believed: the card is its own
    await _remove(nc, "old-home")
    await _register(nc, "new-home", "new")
    await register("other", cards=1, zone="other")
    await claim("team-a", priority="low", gang="train", node_selector={"zone": "new"})
    await claim("team-a", priority="low", gang="train", node_selector={"zone": "other"})
    await asyncio.sleep(AGED_S)
    sub = await nc.subscribe("qshare.node.*.cmd.suspend", cb=agent)
    await bus.settled(nc)
    try:
        await service.card_event("old-home", MOVED, busy=True)
    finally:
        await sub.unsubscribe()
    assert suspended == []


def _usage(node: str) -> bytes:
    report = NodeUsage(node=node, interval_ns=10**9, cards=[CardUsage(gpu=MOVED, hp_ns=0)])
    return envelope.encode(envelope.wrap(f"qshare-node-agent/{node}", "io.qshare.usage", report))


async def test_a_node_the_card_was_taken_from_cannot_report_its_usage(
    nc: Client, engine: AsyncEngine
) -> None:
    watch = StarvationWatch(nc, engine, "test-preemptor", window_s=60.0, timeout_s=2.0)
    await _register(nc, "old-home", "old")
    await watch.usage(subjects.usage("old-home"), _usage("old-home"))
    assert (watch.taken, watch.refused) == (1, 0)  # believed: the card was its own
    await _remove(nc, "old-home")
    await _register(nc, "new-home", "new")
    await asyncio.sleep(AGED_S)
    await watch.usage(subjects.usage("old-home"), _usage("old-home"))
    assert (watch.taken, watch.refused) == (1, 1)
