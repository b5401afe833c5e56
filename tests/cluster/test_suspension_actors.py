"""Who suspended a claim and who resumed it: an operator's preemption record names each
token ("<name> (token <id>)") with the reason the suspend gave, and the claim shows who holds
it suspended. Over the real API, preemptor, agent, Postgres and NATS."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import StartAgent, ready_claim


async def admin_token(api: httpx.AsyncClient, name: str) -> tuple[str, dict[str, str]]:
    """A new admin token `name`: how records name it, and the headers that send it."""
    body = {"name": name, "tenant": "ops", "role": "admin"}
    issued = (await api.post("/v1/tokens", json=body)).json()
    return f"{name} (token {issued['id']})", {"Authorization": f"Bearer {issued['token']}"}


async def record_of(api: httpx.AsyncClient, claim_id: str) -> dict[str, Any]:
    [record] = (await api.get("/v1/preemptions", params={"claim": claim_id})).json()
    return dict(record)


async def test_an_operator_record_names_who_suspended_why_and_who_resumed(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    """Before, a record said `operator` and nothing of who: an audit could not tell which
    of a platform team's tokens stopped a tenant's job."""
    await start_agent()
    claim = await ready_claim(api)
    alice, as_alice = await admin_token(api, "ops-alice")
    bob, as_bob = await admin_token(api, "ops-bob")
    path = f"/v1/claims/{claim['id']}"
    why = {"reason": "node maintenance at 14:00"}
    assert (await api.post(f"{path}/suspend", json=why, headers=as_alice)).status_code == 200
    held = (await api.get(path)).json()["suspended"]
    assert (held["by"], held["reason"]) == (alice, "node maintenance at 14:00")
    assert (await api.post(f"{path}/resume", headers=as_bob)).status_code == 200
    record = await record_of(api, claim["id"])
    assert (record["suspended_by"], record["resumed_by"]) == (alice, bob)
    assert record["reason"] == "node maintenance at 14:00"


async def test_a_suspend_without_a_body_records_the_default_reason(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    """Guard: the body stays optional, as before."""
    await start_agent()
    claim = await ready_claim(api)
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    assert (await record_of(api, claim["id"]))["reason"] == "operator"


async def test_a_bad_reason_is_refused_naming_it_and_nothing_is_recorded(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent()
    claim = await ready_claim(api)
    path = f"/v1/claims/{claim['id']}/suspend"
    for body in ({"reason": "x" * 254}, {"reason": "a\x00b"}, {"reason": 7}):
        refused = await api.post(path, json=body)
        assert refused.status_code == 422 and "reason" in refused.text, refused.text
    assert (await api.get("/v1/preemptions", params={"claim": claim["id"]})).json() == []


async def test_a_caller_cannot_name_someone_else_as_the_actor(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    """Trust: the API names the caller's token; a body naming another is refused."""
    await start_agent()
    claim = await ready_claim(api)
    body = {"reason": "x", "actor": "ops-alice (token 00000000-0000-0000-0000-000000000000)"}
    refused = await api.post(f"/v1/claims/{claim['id']}/suspend", json=body)
    assert refused.status_code == 422 and "actor" in refused.text
