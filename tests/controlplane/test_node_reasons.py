"""What a node agent says for people (why it refused a vGPU, a card's sharing, a timeslice)
never costs the report that carries it: a NUL, which Postgres text cannot hold, comes out as
U+FFFD, and a reason longer than REASON_MAX is cut, where before the report was lost (a
heartbeat, the node timing out) or its apply could never be recorded. A refusal naming a local
id no vGPU can have is left out, not allowed to fail the rest of its apply."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import ApplyDesired, ApplyReply, Refusal
from qshare.contracts.sharing import REASON_MAX, SharingRefusal
from tests.controlplane.conftest import ADMIN_TOKEN, Claim, auth, claim_status, eventually
from tests.controlplane.refusing_agent import register_one_card
from tests.controlplane.test_card_sharing import beat_raw, sharing

NODE = "odd-words"
UNREADABLE = "no room\x00in the driver"


async def _refuse_everything(nc: Client, msg: Msg) -> None:
    desired = envelope.decode(msg.data).payload(ApplyDesired)
    refused = [Refusal.model_construct(local_id=v.local_id, reason=UNREADABLE)
               for v in desired.vgpus]  # fmt: skip
    cards = [SharingRefusal.model_construct(gpu=f"{NODE}-g0", reason="x" * 5000)]
    answer = ApplyReply.model_construct(
        node=NODE, generation=desired.generation, applied=[], refused=refused, stale=False,
        sharing=[], sharing_refused=cards,
    )  # fmt: skip
    await rpc.reply_ok(nc, msg, f"qshare-node-agent/{NODE}", answer)


@pytest.fixture
async def refusing_node(nc: Client) -> AsyncIterator[None]:
    """NODE, registered with one card, its applies answered by an agent that refuses every
    vGPU with a NUL in its reason (and the card's sharing with 5,000 characters)."""

    async def answer(msg: Msg) -> None:
        await _refuse_everything(nc, msg)

    sub = await nc.subscribe(subjects.node_command(NODE, "apply"), cb=answer)
    await bus.settled(nc)
    await register_one_card(nc, NODE)
    yield
    await sub.unsubscribe()


async def _reason(engine: AsyncEngine, claim_id: uuid.UUID) -> Any:
    async with engine.connect() as conn:
        query = text("SELECT reason FROM claims WHERE id = :id")
        return (await conn.execute(query, {"id": claim_id})).scalar_one()


async def test_a_vgpu_refused_with_a_nul_in_its_reason_fails_its_claim_with_the_reason_readable(
    engine: AsyncEngine, claim: Claim, refusing_node: None
) -> None:
    placed = await claim("team-a", priority="low")

    async def failed() -> bool:
        return await claim_status(engine, placed.id) == "failed"

    await eventually(failed)
    assert "no room\ufffdin the driver" in await _reason(engine, placed.id)


async def test_a_heartbeat_whose_timeslice_reason_holds_a_nul_still_counts(
    nc: Client, api: httpx.AsyncClient, refusing_node: None
) -> None:
    report = sharing(f"{NODE}-g0").model_dump(mode="json") | {"timeslice_refused": "a\x00b"}
    await beat_raw(nc, NODE, {"sharing": [report]})
    shown = (await api.get(f"/v1/gpus/{NODE}-g0", headers=auth(ADMIN_TOKEN))).json()
    assert shown["sharing"]["timeslice_refused"] == "a\ufffdb"


def test_a_node_reason_longer_than_the_limit_is_cut_not_refused() -> None:
    assert len(SharingRefusal(gpu="g", reason="x" * 5000).reason) == REASON_MAX


WILD_ID = 2**31  # names no vGPU: local ids are below 2^31


@pytest.fixture
async def wildly_refusing_node(nc: Client) -> AsyncIterator[None]:
    """NODE, registered with one card, its applies answered by an agent that applies every
    vGPU asked and also refuses a local id no vGPU can have."""

    async def answer(msg: Msg) -> None:
        desired = envelope.decode(msg.data).payload(ApplyDesired)
        wild = [Refusal(local_id=WILD_ID, reason="no such vGPU")]
        applied = [v.local_id for v in desired.vgpus]
        reply = ApplyReply(node=NODE, generation=desired.generation, applied=applied, refused=wild)
        await rpc.reply_ok(nc, msg, f"qshare-node-agent/{NODE}", reply)

    sub = await nc.subscribe(subjects.node_command(NODE, "apply"), cb=answer)
    await bus.settled(nc)
    await register_one_card(nc, NODE)
    yield
    await sub.unsubscribe()


async def test_a_refusal_naming_a_local_id_out_of_range_does_not_stop_the_apply_confirming(
    engine: AsyncEngine, claim: Claim, wildly_refusing_node: None
) -> None:
    placed = await claim("team-a", priority="low")

    async def ready() -> bool:
        return await claim_status(engine, placed.id) == "ready"

    await eventually(ready)
