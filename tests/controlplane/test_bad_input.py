"""Bad input found by the audit (issue 11, item 6): each gets a 422 problem naming the field,
never a 500."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from nats.aio.client import Client

from qshare.contracts import envelope
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth

GOOD = {"priority": "high", "vcore": 20, "vmemory": "2Gi"}


@pytest.fixture
def team_a(tenant_tokens: dict[str, str]) -> dict[str, str]:
    return auth(tenant_tokens["team-a"])


def _fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    return [e["field"] for e in response.json()["errors"]]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/claims?node=n%001", "node"),
        ("/v1/claims?tenant=a%00b", "tenant"),
        ("/v1/gpus?node=n%001", "node"),
        ("/v1/nodes/n%001", "name"),
    ],
)
async def test_a_nul_byte_in_a_parameter_is_a_422_naming_it(
    api: httpx.AsyncClient, path: str, field: str
) -> None:
    assert field in _fields(await api.get(path, headers=auth(ADMIN_TOKEN)))


@pytest.mark.parametrize("tenant", ["%20", "%20%20", "%20team-a", "team-a%20", "team%09a", "a%7F"])
async def test_a_blank_or_padded_tenant_in_a_quota_path_is_a_422_naming_it(
    api: httpx.AsyncClient, tenant: str
) -> None:
    response = await api.put(f"/v1/quotas/{tenant}", json={}, headers=auth(ADMIN_TOKEN))
    assert _fields(response) == ["tenant"]


@pytest.mark.parametrize("tenant", [" ", " team-a", "team-a\n", "team\u0085a"])
async def test_a_blank_or_padded_tenant_in_a_token_is_a_422_naming_it(
    api: httpx.AsyncClient, tenant: str
) -> None:
    body = {"name": "padded", "tenant": tenant, "role": "tenant"}
    response = await api.post("/v1/tokens", json=body, headers=auth(ADMIN_TOKEN))
    assert _fields(response) == ["tenant"]


@pytest.mark.parametrize("path", ["/v1/claims?tenant=%20", "/v1/me/quota?tenant=a%20"])
async def test_a_blank_or_padded_tenant_filter_is_a_422_naming_it(
    api: httpx.AsyncClient, path: str
) -> None:
    assert _fields(await api.get(path, headers=auth(ADMIN_TOKEN))) == ["tenant"]


@pytest.mark.parametrize(
    "created", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2025-01-01T00:00:00"]
)
async def test_a_cursor_with_an_impossible_time_is_a_422_naming_it(
    api: httpx.AsyncClient, team_a: dict[str, str], created: str
) -> None:
    raw = json.dumps([created, "00000000-0000-0000-0000-000000000001"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode()
    assert _fields(await api.get(f"/v1/claims?cursor={cursor}", headers=team_a)) == ["cursor"]


@pytest.mark.parametrize("vmemory", ["99999999999999999999999Pi", "1" * 40 + "Gi", "1e5Gi"])
async def test_an_absurd_vmemory_is_a_422_naming_it(
    api: httpx.AsyncClient, team_a: dict[str, str], vmemory: str
) -> None:
    response = await api.post("/v1/claims", json=GOOD | {"vmemory": vmemory}, headers=team_a)
    assert _fields(response) == ["vmemory"]


async def test_a_body_that_is_not_utf8_gets_a_422_problem_naming_the_body(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    headers = team_a | {"content-type": "application/json"}
    response = await api.post("/v1/claims", content=b'{"vcore": "\xff\xfe"}', headers=headers)
    assert _fields(response) == ["body"]


async def test_a_heartbeat_listing_too_many_cards_is_refused_naming_the_field(
    nc: Client, register: Register
) -> None:
    await register("n1")
    beat = {"unhealthy": [f"g{i}" for i in range(40_000)]}
    body = envelope.encode(envelope.Envelope(source="test", type="io.qshare.hb", data=beat))
    reply = await nc.request("qshare.node.n1.heartbeat", body, timeout=10)
    assert reply.headers is not None
    assert reply.headers["Nats-Service-Error-Code"] == "422"
    assert b"unhealthy" in reply.data


async def test_an_unsupported_method_is_a_405_problem_with_allow(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    response = await api.put("/v1/claims", json=GOOD, headers=team_a)
    assert response.status_code == 405
    assert response.headers["content-type"] == "application/problem+json"
    assert "POST" in response.headers["allow"]


async def test_an_integer_written_as_a_whole_float_is_accepted_as_the_schema_says(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    body = GOOD | {"vcore": 20.0, "count": 1.0, "vmemory": 2048.0}
    response = await api.post("/v1/claims", json=body, headers=team_a)
    assert response.status_code == 201, response.text
    assert (response.json()["vcore"], response.json()["vmemory_mib"]) == (20, 2048)


async def test_the_openapi_document_describes_problem_documents_and_outages(
    api: httpx.AsyncClient,
) -> None:
    create = (await api.get("/openapi.json")).json()["paths"]["/v1/claims"]["post"]
    for status in ("409", "422", "429", "503"):
        assert "application/problem+json" in create["responses"][status]["content"]


async def test_a_405_allows_every_method_of_the_path(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    response = await api.put("/v1/nodes/n1", headers=team_a)
    assert response.headers["allow"] == "DELETE, GET, PATCH"


async def test_a_405_on_a_tenant_holding_a_slash_allows_every_method_of_the_path(
    api: httpx.AsyncClient,
) -> None:
    """`/v1/quotas/{tenant}` takes a tenant with a `/`: its 405 named no method (an empty
    `Allow`), its template being matched one segment a name."""
    response = await api.get("/v1/quotas/org%2Fteam", headers=auth(ADMIN_TOKEN))
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, PATCH, PUT"


async def test_a_decimal_quantity_is_refused_with_the_binary_one_it_likely_means(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    refused = await api.post("/v1/claims", json=GOOD | {"vmemory": "4G"}, headers=team_a)
    assert _fields(refused) == ["vmemory"]
    assert refused.json()["errors"][0]["message"] == (
        "must be a whole number of MiB ('4G' is 4x10^9 bytes; did you mean 4Gi?)"
    )


async def test_a_problems_messages_carry_no_validator_prefix(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    refused = await api.post("/v1/claims", json=GOOD | {"vmemory": "lots"}, headers=team_a)
    assert _fields(refused) == ["vmemory"]
    assert "Value error" not in refused.text


@pytest.mark.parametrize("kind", ["application/x-www-form-urlencoded", "text/plain", None])
async def test_a_json_body_sent_as_another_content_type_says_to_send_json(
    api: httpx.AsyncClient, team_a: dict[str, str], kind: str | None
) -> None:
    """`curl -d '{...}'` sends a form: before, the 422 said only "body: Input should be a
    valid dictionary or object to extract fields from"."""
    headers = team_a | ({"Content-Type": kind} if kind else {})
    response = await api.post("/v1/claims", content=json.dumps(GOOD), headers=headers)
    assert response.status_code == 422
    assert _fields(response) == ["body"]
    assert "Content-Type: application/json" in response.json()["detail"]
    assert (kind or "no Content-Type") in response.json()["detail"]


@pytest.mark.parametrize(
    ("second", "message"),
    [({"uuid": "d-g0", "index": 1}, "card UUIDs must be distinct"),
     ({"uuid": "d-g1", "index": 0}, "card indexes must be distinct")],
)  # fmt: skip
async def test_a_registration_naming_a_card_twice_names_gpus_not_the_body(
    api: httpx.AsyncClient, second: dict[str, object], message: str
) -> None:
    """Before, the problem's field was `body` (a check of the whole registration)."""
    card = {"uuid": "d-g0", "index": 0, "model": "A", "memory": "16Gi"}
    body = {"name": "d", "gpus": [card, card | second]}
    response = await api.post("/v1/nodes", json=body, headers=auth(ADMIN_TOKEN))
    assert _fields(response) == ["gpus"]
    assert response.json()["errors"][0]["message"] == message


@pytest.mark.parametrize("generation", [False, True, "3", 1.5])
async def test_a_registration_s_applied_generation_is_an_integer_not_a_boolean(
    api: httpx.AsyncClient, generation: object
) -> None:
    """Before, `false` and `true` passed as generations 0 and 1 (the schema says integer; the
    fuzz run, once memory fields admitted quantities, sent `false` and was answered 200)."""
    card = {"uuid": "d-g0", "index": 0, "model": "A", "memory": "16Gi"}
    body = {"name": "d", "gpus": [card], "applied_generation": generation}
    response = await api.post("/v1/nodes", json=body, headers=auth(ADMIN_TOKEN))
    assert _fields(response) == ["applied_generation"]
