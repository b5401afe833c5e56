"""A node agent's answer that is not a reply of the kind asked for (a bug, a version skew, a
node identity in hostile hands) counts as no answer: whoever asked goes on as after a
timeout, and nothing it owes (a resume) is forgotten."""

from __future__ import annotations

import uuid

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import rpc, subjects
from qshare.contracts.errors import QshareError
from qshare.contracts.preemption import ClaimAction
from qshare_preemptor.service import PreemptionService
from tests.controlplane.conftest import Claim, Register

NOT_A_REPLY = [b"not json", b'{"source": "x", "type": "y", "data": {"done": "all"}}']


@pytest.mark.parametrize("answer", NOT_A_REPLY)
async def test_rpc_call_raises_a_malformed_reply_as_a_qshare_error(
    nc: Client, answer: bytes
) -> None:
    async def agent(msg: Msg) -> None:
        await nc.publish(msg.reply, answer)

    subject = f"qshare.node.malformed-{uuid.uuid4().hex[:8]}.cmd.resume"
    sub = await nc.subscribe(subject, cb=agent)
    await bus.settled(nc)
    try:
        with pytest.raises(QshareError, match="malformed reply"):
            await rpc.call(nc, subject, "test", ClaimAction(claim_id=uuid.uuid4()), ClaimAction)
    finally:
        await sub.unsubscribe()


async def test_a_resume_answered_with_a_malformed_reply_is_sent_again(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    await register("garbled", cards=1)
    held = await claim("team-a", priority="low")
    resumes: list[bytes] = []

    async def agent(msg: Msg) -> None:
        resumes.append(msg.data)
        await nc.publish(msg.reply, NOT_A_REPLY[1])

    sub = await nc.subscribe(subjects.node_command("garbled", "resume"), cb=agent)
    await bus.settled(nc)
    try:
        service = PreemptionService(nc, engine, "test-preemptor", timeout_s=2.0)
        answer = await service.operator(ClaimAction(claim_id=held.id), suspend=False)
        assert (answer.vgpus, answer.missing) == (0, 1)
        await service.resume_again()
    finally:
        await sub.unsubscribe()
    assert len(resumes) == 2
