"""The node agent refuses bad commands with a clear error and leaves its segment unchanged:
a malformed or forged `cmd.apply`, a vGPU on a card it does not have, one larger than its card."""

from __future__ import annotations

import json
import uuid

import pytest
from nats.aio.client import Client as Nats

from qshare.contracts import rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply, DesiredVgpu
from qshare.contracts.domain import Priority
from qshare.contracts.errors import InvalidInput, NotFound
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.commands import PolicyCommand, PolicyReply

from .conftest import StartAgent


def vgpu(agent: NodeAgent, local_id: int, **change: object) -> DesiredVgpu:
    fields = {
        "local_id": local_id, "id": uuid.uuid4(), "claim_id": uuid.uuid4(),
        "gpu": agent.cards[0].uuid, "priority": Priority.LOW, "vcore": 10, "vmemory_mib": 1024,
    } | change  # fmt: skip
    return DesiredVgpu.model_validate(fields)


async def apply(nc: Nats, node: str, desired: ApplyDesired) -> ApplyReply:
    subject = subjects.node_command(node, "apply")
    return await rpc.call(nc, subject, "test", desired, ApplyReply)


def held(agent: NodeAgent) -> set[int]:
    return set(agent.applied)


async def test_a_malformed_apply_is_refused_naming_the_field(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    data = {"node": agent.name, "generation": "x", "vgpus": []}
    body = json.dumps({"specversion": "1.0", "id": "1", "source": "x", "type": "t", "data": data})
    reply = await nc.request(subjects.node_command(agent.name, "apply"), body.encode(), timeout=5)
    assert b"generation" in reply.data
    assert held(agent) == set()


async def test_an_apply_addressed_to_another_node_is_refused(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    forged = ApplyDesired(node="someone-else", generation=1, vgpus=[vgpu(agent, 7)])
    with pytest.raises(InvalidInput, match="not someone-else"):
        await apply(nc, agent.name, forged)
    assert held(agent) == set()


async def test_a_vgpu_on_an_unknown_card_is_refused_and_not_created(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    desired = ApplyDesired(node=agent.name, generation=1, vgpus=[vgpu(agent, 7, gpu="GPU-nope")])
    reply = await apply(nc, agent.name, desired)
    assert [(r.local_id, "no card GPU-nope" in r.reason) for r in reply.refused] == [(7, True)]
    assert held(agent) == set()


async def test_a_vgpu_larger_than_its_card_is_refused_and_the_rest_applied(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent(memory="16Gi")
    desired = ApplyDesired(
        node=agent.name, generation=1,
        vgpus=[vgpu(agent, 7, vmemory_mib=32 * 1024), vgpu(agent, 8)],
    )  # fmt: skip
    reply = await apply(nc, agent.name, desired)
    assert [r.local_id for r in reply.refused] == [7]
    assert reply.applied == [8]


async def test_an_older_generation_changes_nothing(nc: Nats, start_agent: StartAgent) -> None:
    agent = await start_agent()
    await apply(nc, agent.name, ApplyDesired(node=agent.name, generation=5, vgpus=[vgpu(agent, 8)]))
    stale = await apply(nc, agent.name, ApplyDesired(node=agent.name, generation=4, vgpus=[]))
    assert stale.stale and held(agent) == {8}


async def test_an_unknown_command_is_refused(nc: Nats, start_agent: StartAgent) -> None:
    agent = await start_agent()
    desired = ApplyDesired(node=agent.name, generation=1, vgpus=[])
    with pytest.raises(NotFound, match="unknown command"):
        await rpc.call(nc, subjects.node_command(agent.name, "explode"), "t", desired, ApplyReply)


async def set_policy(nc: Nats, node: str, command: PolicyCommand) -> PolicyReply:
    return await rpc.call(nc, subjects.node_command(node, "policy"), "test", command, PolicyReply)


async def test_a_policy_command_turns_a_cards_device_gate_on_and_reports_it(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    reply = await set_policy(nc, agent.name, PolicyCommand(gpu=gpu, lp_device_gate=True))
    assert reply.lp_device_gate is True
    assert agent.node.card_stats(agent.cards[0].index).lp_device_gate is True
    assert agent.node.card_stats(agent.cards[1].index).lp_device_gate is False


async def test_the_device_gate_setting_applies_to_every_card_at_start(
    start_agent: StartAgent,
) -> None:
    agent = await start_agent(lp_device_gate=True)
    assert all(agent.node.card_stats(c.index).lp_device_gate for c in agent.cards)
