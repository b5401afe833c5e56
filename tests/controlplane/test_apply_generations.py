"""The allocator records a node's answer to `cmd.apply` only for a generation it has asked
of that node: an answer naming a later one (a bug, an agent still counting in the numbering
of a node row since deleted, a node identity in hostile hands) confirms nothing."""

from __future__ import annotations

import asyncio
import uuid

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply
from qshare.contracts.schema import nodes
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Claim, claim_status, eventually
from tests.controlplane.refusing_agent import held_refuser, register_one_card

NODE = "far-ahead"


class Agent:
    """Answers the first apply with a generation far ahead of any asked, the others truly."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.answers = 0

    async def apply(self, msg: Msg) -> None:
        desired = envelope.decode(msg.data).payload(ApplyDesired)
        self.answers += 1
        generation = 10**9 if self.answers == 1 else desired.generation
        applied = [] if self.answers == 1 else [v.local_id for v in desired.vgpus]
        answer = ApplyReply(node=NODE, generation=generation, applied=applied)
        await rpc.reply_ok(self.nc, msg, f"qshare-node-agent/{NODE}", answer)


async def _generations(engine: AsyncEngine) -> tuple[int, int]:
    query = select(nodes.c.applied_generation, nodes.c.desired_generation)
    async with engine.connect() as conn:
        applied, desired = (await conn.execute(query.where(nodes.c.name == NODE))).one()
    return int(applied), int(desired)


async def _ready(engine: AsyncEngine, claim_id: uuid.UUID) -> bool:
    return await claim_status(engine, claim_id) == "ready"


async def test_an_apply_answer_naming_a_generation_never_asked_is_not_recorded(
    nc: Client, engine: AsyncEngine, claim: Claim
) -> None:
    agent = Agent(nc)
    sub = await nc.subscribe(subjects.node_command(NODE, "apply"), cb=agent.apply)
    await bus.settled(nc)
    try:
        await register_one_card(nc, NODE)
        placed = await claim("team-a", priority="low")
        await eventually(lambda: _ready(engine, placed.id))
    finally:
        await sub.unsubscribe()
    applied, desired = await _generations(engine)
    assert applied <= desired


async def test_an_answer_older_than_one_confirmed_fails_no_claim_it_since_applied(
    nc: Client, engine: AsyncEngine, claim: Claim, replicas: list[Allocator]
) -> None:
    async with held_refuser(nc, NODE) as agent:
        first = await claim("team-a", priority="low")
        await eventually(lambda: _holds(agent.held))
        second = await claim("team-a", priority="low")  # a newer apply, answered at once
        await eventually(lambda: _ready(engine, first.id))
        await eventually(lambda: _ready(engine, second.id))
        agent.release.set()  # the older answer arrives last
        await eventually(lambda: _no_apply_on_its_way(replicas))
    assert await claim_status(engine, first.id) == "ready"


async def _holds(value: bool) -> bool:
    await asyncio.sleep(0)
    return value


async def _no_apply_on_its_way(replicas: list[Allocator]) -> bool:
    """Every apply to the node sent and its answer handled (read from the dispatchers'
    bookkeeping: no other signal tells an answer that changed nothing was handled)."""
    return all(NODE not in r.dispatcher._in_flight for r in replicas)
