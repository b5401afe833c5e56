"""The allocator's NATS edge: malformed messages, error replies, events after commit."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim
from qshare.contracts.errors import ERROR_CODE_HEADER
from qshare_allocator.app import Allocator
from qshare_allocator.db import in_transaction
from tests.controlplane.conftest import Claim, Register, eventually


def _rejected() -> float:
    value = REGISTRY.get_sample_value(
        "qshare_allocator_rejected_messages_total", {"subject": subjects.CLAIMS_CREATE}
    )
    return value or 0.0


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"specversion": "1.0"}', envelope.encode(envelope.wrap("t", "x", None))],
    ids=["not-json", "not-an-object", "no-envelope", "no-data"],
)
async def test_a_malformed_command_gets_an_error_reply_and_is_counted(
    nc: Client, replicas: list[Allocator], body: bytes
) -> None:
    before = _rejected()
    reply = await nc.request(subjects.CLAIMS_CREATE, body, timeout=5)
    assert reply.headers is not None and reply.headers[ERROR_CODE_HEADER] == "422"
    assert json.loads(reply.data)["code"] == "invalid"
    assert _rejected() == before + 1


async def test_a_well_formed_request_refused_for_its_content_is_not_counted_as_malformed(
    nc: Client, replicas: list[Allocator]
) -> None:
    before = _rejected()
    data = {"tenant": "t", "spec": {"priority": "low", "vcore": 10, "vmemory": "1Gi",
                                    "class_name": "no-such-class"}}  # fmt: skip
    body = json.dumps({"source": "t", "type": "x", "data": data}).encode()
    reply = await nc.request(subjects.CLAIMS_CREATE, body, timeout=5)
    assert json.loads(reply.data)["code"] == "invalid"
    assert _rejected() == before


async def test_the_allocator_keeps_serving_after_malformed_messages(
    nc: Client, register: Register, claim: Claim
) -> None:
    await nc.request(subjects.CLAIMS_CREATE, b"\xff\xfe", timeout=5)
    await register("n1")
    assert (await claim()).status == "placed"


async def test_an_invalid_field_is_named_in_the_error_reply(
    nc: Client, replicas: list[Allocator]
) -> None:
    data = {"tenant": "t", "spec": {"priority": "high", "vcore": 101, "vmemory": "1Gi"}}
    body = json.dumps({"source": "t", "type": "x", "data": data}).encode()
    reply = await nc.request(subjects.CLAIMS_CREATE, body, timeout=5)
    assert [e["field"] for e in json.loads(reply.data)["errors"]] == ["spec.vcore"]


async def test_a_placement_is_published_after_commit(
    nc: Client, register: Register, claim: Claim
) -> None:
    js = nc.jetstream()
    await register("n1")
    placed = await claim()
    subject = subjects.claim_event(str(placed.id), "placed")
    sub = await js.subscribe(subject, ordered_consumer=True)
    message = await sub.next_msg(timeout=10)
    assert envelope.decode(message.data).data["id"] == str(placed.id)  # type: ignore[index]
    await sub.unsubscribe()


async def test_a_rolled_back_change_publishes_nothing(
    register: Register, replicas: list[Allocator], engine: AsyncEngine
) -> None:
    await register("n1")
    allocator = replicas[0]
    command = CreateClaim(tenant="t", spec=ClaimSpec(priority="low", vcore=5, vmemory=2048))

    async def create_then_fail(conn: object) -> None:
        await allocator.claims.create(conn, command)  # type: ignore[arg-type]
        raise RuntimeError("the caller fails after the service wrote")

    async def outbox_empty() -> bool:
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one() == 0

    await eventually(outbox_empty)
    with pytest.raises(RuntimeError):
        await in_transaction(engine, create_then_fail)
    async with engine.connect() as conn:
        claims = (await conn.execute(text("SELECT count(*) FROM claims"))).scalar_one()
        outbox = (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one()
        allocated = (await conn.execute(text("SELECT sum(allocated_mib) FROM gpus"))).scalar_one()
    assert (claims, outbox, allocated) == (0, 0, 0)
