"""Bounded fields and an outbox that no single event can block (issue 11, item 1)."""

from __future__ import annotations

import json

import httpx
import pytest
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, subjects
from qshare.contracts.errors import ERROR_CODE_HEADER
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Claim, Register, auth, eventually

GOOD = {"priority": "high", "vcore": 20, "vmemory": "2Gi"}


@pytest.mark.parametrize(
    ("selector", "field"),
    [
        ({f"k{i}": "v" for i in range(33)}, "node_selector"),
        ({"zone": "v" * 64}, "node_selector.zone"),
        ({"k" * 254: "v"}, "node_selector.[key]"),
    ],
    ids=["too-many-labels", "value-too-long", "key-too-long"],
)
async def test_an_oversized_selector_over_nats_is_refused_naming_it(
    nc: Client, replicas: list[Allocator], selector: dict[str, str], field: str
) -> None:
    data = {"tenant": "t", "spec": GOOD | {"node_selector": selector}}
    body = json.dumps({"source": "t", "type": "x", "data": data}).encode()
    reply = await nc.request(subjects.CLAIMS_CREATE, body, timeout=5)
    assert reply.headers is not None and reply.headers[ERROR_CODE_HEADER] == "422"
    fields = [e["field"] for e in json.loads(reply.data)["errors"]]
    assert any(f.startswith("spec." + field.split(".")[0]) for f in fields), fields


async def test_a_580_kb_selector_sent_over_nats_is_refused_and_stores_nothing(
    nc: Client, replicas: list[Allocator], engine: AsyncEngine
) -> None:
    selector = {f"key-{i}": "v" * 60 for i in range(9000)}
    data = {"tenant": "t", "spec": GOOD | {"node_selector": selector}}
    body = json.dumps({"source": "t", "type": "x", "data": data}).encode()
    reply = await nc.request(subjects.CLAIMS_CREATE, body, timeout=5)
    assert reply.headers is not None and reply.headers[ERROR_CODE_HEADER] == "422"
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM claims"))).scalar_one() == 0


async def test_the_body_limit_itself_is_bounded() -> None:
    from pydantic import ValidationError

    from qshare_api.settings import ApiSettings

    with pytest.raises(ValidationError, match="max_body_bytes"):
        ApiSettings(max_body_bytes=4 * 1024 * 1024)


async def test_a_pending_reason_quotes_a_bounded_selector(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str], register: Register
) -> None:
    await register("n1")
    selector = {f"k{i:02d}": "v" * 60 for i in range(32)}
    body = GOOD | {"node_selector": selector}
    # the conftest API has a 4 KiB body limit; this body is about 2.5 KiB
    response = await api.post("/v1/claims", json=body, headers=auth(tenant_tokens["team-a"]))
    assert response.status_code == 201, response.text
    reason = response.json()["reason"]
    assert reason.startswith("no Ready, schedulable node matching k00=") and len(reason) < 400


async def test_an_event_too_large_to_publish_is_set_aside_and_later_events_still_flow(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    huge = envelope.encode(envelope.Envelope(source="t", type="x", data={"blob": "x" * 2**21}))
    async with engine.begin() as conn:
        insert = "INSERT INTO outbox (subject, body) VALUES ('qshare.evt.claim.huge.placed', :b)"
        await conn.execute(text(insert), {"b": huge})
    await register("n1")
    later = await claim()
    js = nc.jetstream()
    sub = await js.subscribe(subjects.claim_event(str(later.id), "placed"), ordered_consumer=True)
    assert envelope.decode((await sub.next_msg(timeout=10)).data).data["id"] == str(later.id)  # type: ignore[index]
    await sub.unsubscribe()

    async def set_aside() -> bool:
        async with engine.connect() as conn:
            dead = (await conn.execute(text("SELECT subject FROM outbox_dead"))).scalars().all()
            left = (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one()
        return list(dead) == ["qshare.evt.claim.huge.placed"] and left == 0

    await eventually(set_aside)
