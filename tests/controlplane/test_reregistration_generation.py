"""A running node agent that registers again (its labels changed: the Node's policy label in
Kubernetes, say) keeps the generation the allocator confirmed of it; one that restarted
(it says it applied nothing yet) confirms nothing until its first apply, as before."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply
from qshare.contracts.nodes import MAX_GENERATION, GpuSpec, NodeRegistration, NodeView
from qshare.contracts.schema import nodes
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Claim, claim_status, eventually

NODE = "relabelled-node"


class HoldingAgent:
    """Answers every apply truly, at once while `answering` is set, else once it is."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.answering = asyncio.Event()
        self.answering.set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def apply(self, msg: Msg) -> None:
        task = asyncio.create_task(self._answer(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        desired = envelope.decode(msg.data).payload(ApplyDesired)
        await self.answering.wait()
        ids = [v.local_id for v in desired.vgpus]
        answer = ApplyReply(node=NODE, generation=desired.generation, applied=ids)
        await rpc.reply_ok(self.nc, msg, f"qshare-node-agent/{NODE}", answer)


async def register(nc: Client, applied: int | None, zone: str) -> None:
    card = GpuSpec(uuid=f"{NODE}-g0", index=0, model="sim", memory="16Gi")
    said = {} if applied is None else {"applied_generation": applied}
    registration = NodeRegistration(
        name=NODE, labels={"zone": zone}, gpus=[card], segment=f"seg-{NODE}", **said
    )
    await rpc.call(nc, subjects.node_register(NODE), "test", registration, NodeView)


async def generations(engine: AsyncEngine) -> tuple[int, int]:
    query = select(nodes.c.applied_generation, nodes.c.desired_generation)
    async with engine.connect() as conn:
        applied, desired = (await conn.execute(query.where(nodes.c.name == NODE))).one()
    return int(applied), int(desired)


async def test_a_running_agent_registering_again_keeps_its_confirmed_generation(
    nc: Client, engine: AsyncEngine, claim: Claim, replicas: list[Allocator]
) -> None:
    """Before: the registration set it to -1 until the apply it caused was answered, so the
    node was taken for one that confirmed nothing (its cards' asked sharing pending, its
    claims' releases unconfirmed) meanwhile, and longer when its answer was slow."""
    agent = HoldingAgent(nc)
    sub = await nc.subscribe(subjects.node_command(NODE, "apply"), cb=agent.apply)
    await bus.settled(nc)
    try:
        await register(nc, None, "a")
        placed = await claim("team-a", priority="low")

        async def ready() -> bool:
            return await claim_status(engine, placed.id) == "ready"

        async def confirmed() -> bool:
            applied, desired = await generations(engine)
            return applied == desired

        await eventually(ready)
        await eventually(confirmed)
        applied, _ = await generations(engine)
        assert applied >= 1
        agent.answering.clear()  # the applies the registrations cause wait
        await register(nc, applied, "b")  # the agent's labels changed
        assert (await generations(engine))[0] == applied
        await register(nc, applied + 5, "c")  # never more than the allocator confirmed
        assert (await generations(engine))[0] == applied
        await register(nc, -1, "c")  # restarted: nothing confirmed until its first apply
        assert (await generations(engine))[0] == -1
        agent.answering.set()
        await eventually(confirmed)
    finally:
        agent.answering.set()
        await sub.unsubscribe()


async def test_a_new_row_counts_on_past_what_its_agent_says_it_applied(
    nc: Client, engine: AsyncEngine, replicas: list[Allocator]
) -> None:
    """A node deleted while its agent ran, registered again before any cmd.register (its
    labels changed), starts past the agent's generation: counting from 0 again, every apply
    was answered as stale (tests/cluster/test_deleted_node_relabel.py). A starting agent's
    node still counts from 0; the largest generation stays within the column."""
    await register(nc, 7, "a")
    assert await generations(engine) == (-1, 8)
    async with engine.begin() as conn:
        await conn.execute(nodes.delete().where(nodes.c.name == NODE))
    await register(nc, None, "a")
    assert await generations(engine) == (-1, 0)
    async with engine.begin() as conn:
        await conn.execute(nodes.delete().where(nodes.c.name == NODE))
    await register(nc, MAX_GENERATION, "a")
    assert await generations(engine) == (-1, MAX_GENERATION)
