"""The allocator believes a node's answer to `cmd.apply` only about the node it asked: a node
agent that answers naming another node (a bug, or a node identity in hostile hands) changes
nothing on that other node."""

from __future__ import annotations

import asyncio
import os

import httpx
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.contracts import rpc, subjects
from qshare.contracts.agent import ApplyReply, Refusal
from qshare.contracts.nodes import GpuSpec, NodeRegistration, NodeView

from .conftest import StartAgent, eventually, ready_claim


async def test_an_apply_reply_naming_another_node_fails_none_of_its_claims(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    victim = await start_agent()
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    hostile = f"hostile-{os.getpid()}"
    answered: list[int] = []

    async def forge(msg: Msg) -> None:
        answered.append(1)
        lie = ApplyReply(
            node=victim.name, generation=10**9, applied=[],
            refused=[Refusal(local_id=local_id, reason="forged")],
        )  # fmt: skip
        await rpc.reply_ok(nc, msg, f"qshare-node-agent/{hostile}", lie)

    sub = await nc.subscribe(subjects.node_command(hostile, "apply"), cb=forge)
    await bus.settled(nc)
    registration = NodeRegistration(
        name=hostile, gpus=[GpuSpec(uuid=f"GPU-{hostile}", index=0, model="sim", memory="16Gi")],
        segment=f"seg-{hostile}",
    )  # fmt: skip
    await rpc.call(nc, subjects.node_register(hostile), "test", registration, NodeView)
    await eventually(lambda: _holds(len(answered) >= 2))  # the first answer was handled
    await sub.unsubscribe()
    found = (await api.get(f"/v1/claims/{claim['id']}")).json()
    assert found["status"] == "ready", found
    assert local_id in victim.applied


async def _holds(value: bool) -> bool:
    await asyncio.sleep(0)
    return value
