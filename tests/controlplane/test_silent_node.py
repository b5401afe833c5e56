"""A node that does not answer holds back its own commands only: while the preemptor waits
for it (up to its command timeout), another card's busy event still suspends that card's
gangs. The assertions are on order, not on time: the other card's suspension must be
answered before the silent node's request ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import SuspendCommand, SuspendReply
from qshare_preemptor.service import PreemptionService
from tests.controlplane.conftest import Claim, Register

TIMEOUT_S = 10.0
"""The preemptor's command timeout here: far longer than a suspend takes on a loaded host."""


@asynccontextmanager
async def _agent(nc: Client, node: str, answers: bool) -> AsyncIterator[asyncio.Event]:
    """`node`'s agent; one that `answers` not is silent until the block ends (then it answers
    what it was sent, so nothing waits for the timeout). Yields: a command arrived."""
    arrived, unanswered = asyncio.Event(), list[Msg]()

    async def reply(msg: Msg) -> None:
        ids = envelope.decode(msg.data).payload(SuspendCommand).local_ids
        await rpc.reply_ok(nc, msg, f"test-agent-{node}", SuspendReply(done=ids))

    async def agent(msg: Msg) -> None:
        arrived.set()
        if answers:
            await reply(msg)
        else:
            unanswered.append(msg)

    sub = await nc.subscribe(subjects.node_commands(node), cb=agent)
    await bus.settled(nc)
    try:
        yield arrived
    finally:
        for msg in unanswered:
            await reply(msg)
        await sub.unsubscribe()


async def test_a_silent_node_does_not_hold_back_another_cards_suspension(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    for node in ("silent", "lively"):
        await register(node, cards=2, zone=node)
        await claim("team-a", priority="low", count=2, node_selector={"zone": node})
    service = PreemptionService(nc, engine, "test-preemptor", timeout_s=TIMEOUT_S)
    silent, lively = _agent(nc, "silent", answers=False), _agent(nc, "lively", answers=True)
    async with silent as asked, lively as suspended_on_lively:
        waiting = asyncio.create_task(service.card_event("silent", "silent-g0", busy=True))
        await asyncio.wait_for(asked.wait(), TIMEOUT_S)
        other = asyncio.create_task(service.card_event("lively", "lively-g0", busy=True))
        first, _ = await asyncio.wait({waiting, other}, return_when=asyncio.FIRST_COMPLETED)
        assert first == {other}, "the lively card waited for the silent node's timeout"
        assert suspended_on_lively.is_set()
    await waiting
