"""A stand-in node agent for races with a node's refusal: it registers one card, holds its
first answer about vGPUs until the test releases it and then refuses them, and answers every
other apply truly at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply, Refusal
from qshare.contracts.nodes import GpuSpec, NodeRegistration, NodeView


async def register_one_card(nc: Client, node: str) -> None:
    card = GpuSpec(uuid=f"{node}-g0", index=0, model="sim", memory="16Gi")
    registration = NodeRegistration(name=node, gpus=[card], segment=f"seg-{node}")
    await rpc.call(nc, subjects.node_register(node), "test", registration, NodeView)


class HeldRefuser:
    """Subscribe `apply` to the node's `cmd.apply`; set `release` to let the held refusal go."""

    def __init__(self, nc: Client, node: str) -> None:
        self.nc = nc
        self.node = node
        self.release = asyncio.Event()
        self.held = False
        self.answering: set[asyncio.Task[None]] = set()

    async def apply(self, msg: Msg) -> None:
        """Each apply answered by a task of its own: the held one holds back no other."""
        task = asyncio.create_task(self._answer(msg))
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    async def _answer(self, msg: Msg) -> None:
        desired = envelope.decode(msg.data).payload(ApplyDesired)
        ids = [v.local_id for v in desired.vgpus]
        generation = desired.generation
        if ids and not self.held:
            self.held = True
            await self.release.wait()
            no = [Refusal(local_id=i, reason="no room in the driver") for i in ids]
            answer = ApplyReply(node=self.node, generation=generation, applied=[], refused=no)
        else:
            answer = ApplyReply(node=self.node, generation=generation, applied=ids)
        await rpc.reply_ok(self.nc, msg, f"qshare-node-agent/{self.node}", answer)


@asynccontextmanager
async def held_refuser(nc: Client, node: str) -> AsyncIterator[HeldRefuser]:
    """A HeldRefuser answering `node`'s applies, the node registered with one card."""
    agent = HeldRefuser(nc, node)
    sub = await nc.subscribe(subjects.node_command(node, "apply"), cb=agent.apply)
    await bus.settled(nc)
    try:
        await register_one_card(nc, node)
        yield agent
    finally:
        await sub.unsubscribe()
