"""The REST API: claims over HTTP, authentication, tenancy, bad input as problem documents."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth

GOOD = {"priority": "high", "vcore": 20, "vmemory": "2Gi"}


@pytest.fixture
def team_a(tenant_tokens: dict[str, str]) -> dict[str, str]:
    return auth(tenant_tokens["team-a"])


@pytest.fixture
def team_b(tenant_tokens: dict[str, str]) -> dict[str, str]:
    return auth(tenant_tokens["team-b"])


async def test_creating_a_claim_answers_201_with_its_placement(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    response = await api.post("/v1/claims", json=GOOD, headers=team_a)
    assert response.status_code == 201
    body = response.json()
    assert (body["status"], body["tenant"], body["node"]) == ("placed", "team-a", "n1")


async def test_both_priorities_may_share_a_card(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    high = (await api.post("/v1/claims", json=GOOD, headers=team_a)).json()
    low = (await api.post("/v1/claims", json=GOOD | {"priority": "low"}, headers=team_a)).json()
    assert high["vgpus"][0]["gpu"] == low["vgpus"][0]["gpu"] == "n1-g0"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"vcore": 0}, "vcore"),
        ({"vcore": 101}, "vcore"),
        ({"vcore": 12.5}, "vcore"),
        ({"vcore": "abc"}, "vcore"),
        ({"vmemory": "-1"}, "vmemory"),
        ({"vmemory": "4Gx"}, "vmemory"),
        ({"vmemory": 0}, "vmemory"),
        ({"vmemory": 1.5}, "vmemory"),
        ({"vmemory": "1000Pi"}, "vmemory"),
        ({"node_selector": {"zone": "a\u0000"}}, "node_selector.zone"),
        ({"idempotency_key": "k" * 129}, "idempotency_key"),
        ({"count": 0}, "count"),
        ({"priority": "urgent"}, "priority"),
        ({"placement": {"node": "pack"}}, "placement.node"),
        ({"node_selector": ["zone=a"]}, "node_selector"),
        ({"node_selector": {"zone": 1}}, "node_selector.zone"),
        ({"class_name": "Not A Name"}, "class_name"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_a_bad_field_gets_a_422_problem_naming_it(
    api: httpx.AsyncClient, team_a: dict[str, str], change: dict[str, Any], field: str
) -> None:
    response = await api.post("/v1/claims", json=GOOD | change, headers=team_a)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422
    assert field in [e["field"] for e in problem["errors"]]


async def test_a_body_with_a_lone_surrogate_is_422_not_500(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    body = b'{"priority": "high", "vcore": 5, "vmemory": "1Gi", "idempotency_key": "\\ud800"}'
    headers = team_a | {"content-type": "application/json"}
    response = await api.post("/v1/claims", content=body, headers=headers)
    assert response.status_code == 422


async def test_a_missing_field_is_named(api: httpx.AsyncClient, team_a: dict[str, str]) -> None:
    response = await api.post("/v1/claims", json={"priority": "high", "vcore": 5}, headers=team_a)
    assert [e["field"] for e in response.json()["errors"]] == ["vmemory"]


async def test_a_slice_below_the_minimum_is_a_422_from_the_allocator(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    response = await api.post("/v1/claims", json=GOOD | {"vmemory": "512Mi"}, headers=team_a)
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["vmemory"]


async def test_a_body_that_is_not_json_gets_a_422_problem(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    headers = team_a | {"content-type": "application/json"}
    response = await api.post("/v1/claims", content=b"{vcore: 5", headers=headers)
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body"]


async def test_an_oversized_body_gets_a_422_problem_naming_the_body_and_writes_nothing(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    big = GOOD | {"node_selector": {f"k{i}": "v" * 50 for i in range(100)}}
    response = await api.post("/v1/claims", json=big, headers=team_a)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "body"
    listed = await api.get("/v1/claims", headers=team_a)
    assert listed.json()["items"] == []


async def test_an_unknown_claim_is_404(api: httpx.AsyncClient, team_a: dict[str, str]) -> None:
    response = await api.get(f"/v1/claims/{uuid.uuid4()}", headers=team_a)
    assert response.status_code == 404
    assert response.json()["type"].endswith("not-found")


async def test_another_tenants_claim_is_404_to_read_resize_and_delete(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str], team_b: dict[str, str]
) -> None:
    await register("n1")
    claim_id = (await api.post("/v1/claims", json=GOOD, headers=team_a)).json()["id"]
    assert (await api.get(f"/v1/claims/{claim_id}", headers=team_b)).status_code == 404
    resize = await api.patch(f"/v1/claims/{claim_id}", json={"vcore": 50}, headers=team_b)
    assert resize.status_code == 404
    assert (await api.delete(f"/v1/claims/{claim_id}", headers=team_b)).status_code == 404
    assert (await api.get(f"/v1/claims/{claim_id}", headers=team_a)).json()["status"] == "placed"


async def test_a_missing_token_is_401(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/claims")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_bad_token_is_401(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/claims", headers=auth("qs_wrong"))).status_code == 401


async def test_a_tenant_on_an_admin_route_is_403(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    body = {"name": "x", "tenant": "team-a", "role": "admin"}
    assert (await api.post("/v1/tokens", json=body, headers=team_a)).status_code == 403
    assert (await api.get("/v1/tokens", headers=team_a)).status_code == 403


async def test_a_repeated_idempotency_key_returns_the_original_claim(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    body = GOOD | {"idempotency_key": "job-1"}
    first = await api.post("/v1/claims", json=body, headers=team_a)
    again = await api.post("/v1/claims", json=body, headers=team_a)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len((await api.get("/v1/claims", headers=team_a)).json()["items"]) == 1


async def test_the_idempotency_key_header_works_like_the_field(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    headers = team_a | {"Idempotency-Key": "job-2"}
    first = (await api.post("/v1/claims", json=GOOD, headers=headers)).json()
    again = (await api.post("/v1/claims", json=GOOD, headers=headers)).json()
    assert again["id"] == first["id"]


async def test_an_idempotency_key_header_differing_from_the_field_is_refused(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    headers = team_a | {"Idempotency-Key": "job-3"}
    body = GOOD | {"idempotency_key": "job-4"}
    response = await api.post("/v1/claims", json=body, headers=headers)
    assert response.status_code == 422, response.text
    fields = [e["field"] for e in response.json()["errors"]]
    assert fields == ["Idempotency-Key", "idempotency_key"]
    assert (await api.get("/v1/claims", headers=team_a)).json()["items"] == []


async def test_listing_filters_and_pages(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    for priority in ("high", "low", "low"):
        await api.post("/v1/claims", json=GOOD | {"priority": priority}, headers=team_a)
    lows = (await api.get("/v1/claims?priority=low", headers=team_a)).json()["items"]
    first = (await api.get("/v1/claims?limit=2", headers=team_a)).json()
    rest = (
        await api.get(f"/v1/claims?limit=2&cursor={first['next_cursor']}", headers=team_a)
    ).json()
    assert len(lows) == 2
    assert (len(first["items"]), len(rest["items"]), rest["next_cursor"]) == (2, 1, None)


async def test_a_bad_cursor_is_422(api: httpx.AsyncClient, team_a: dict[str, str]) -> None:
    response = await api.get("/v1/claims?cursor=nonsense", headers=team_a)
    assert [e["field"] for e in response.json()["errors"]] == ["cursor"]


async def test_admin_sees_every_tenants_claims(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str], team_b: dict[str, str]
) -> None:
    await register("n1")
    await api.post("/v1/claims", json=GOOD, headers=team_a)
    await api.post("/v1/claims", json=GOOD, headers=team_b)
    everything = (await api.get("/v1/claims", headers=auth(ADMIN_TOKEN))).json()["items"]
    mine = (await api.get("/v1/claims", headers=team_a)).json()["items"]
    assert {c["tenant"] for c in everything} == {"team-a", "team-b"}
    assert {c["tenant"] for c in mine} == {"team-a"}


async def test_gpus_show_allocated_and_free_capacity(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    await api.post("/v1/claims", json=GOOD, headers=team_a)
    [gpu] = (await api.get("/v1/gpus", headers=team_a)).json()
    assert (gpu["allocated_mib"], gpu["free_mib"], gpu["core_high_free"], gpu["vgpus"]) == (
        2048, 14336, 80, 1,
    )  # fmt: skip


async def test_admin_registers_nodes_and_everyone_lists_them(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    card = {"uuid": "R0", "index": 0, "model": "T4", "memory": "16Gi"}
    node = {"name": "rest-node", "labels": {"zone": "a"}, "gpus": [card]}
    assert (await api.post("/v1/nodes", json=node, headers=team_a)).status_code == 403
    assert (await api.post("/v1/nodes", json=node, headers=auth(ADMIN_TOKEN))).status_code == 200
    [listed] = (await api.get("/v1/nodes", headers=team_a)).json()
    assert (listed["name"], listed["status"], listed["gpus"]) == ("rest-node", "Ready", 1)


async def test_admin_adds_classes_and_a_duplicate_is_409(api: httpx.AsyncClient) -> None:
    body = {"name": f"c-{uuid.uuid4().hex[:8]}", "provisioner": "qshare"}
    assert (await api.post("/v1/classes", json=body, headers=auth(ADMIN_TOKEN))).status_code == 201
    assert (await api.post("/v1/classes", json=body, headers=auth(ADMIN_TOKEN))).status_code == 409


async def test_a_revoked_token_no_longer_authenticates(api: httpx.AsyncClient) -> None:
    body = {"name": "short-lived", "tenant": "team-c"}
    issued = (await api.post("/v1/tokens", json=body, headers=auth(ADMIN_TOKEN))).json()
    assert (await api.get("/v1/claims", headers=auth(issued["token"]))).status_code == 200
    await api.delete(f"/v1/tokens/{issued['id']}", headers=auth(ADMIN_TOKEN))
    assert (await api.get("/v1/claims", headers=auth(issued["token"]))).status_code == 401


async def test_an_issued_token_says_when_it_was_created_as_its_listing_does(
    api: httpx.AsyncClient,
) -> None:
    body = {"name": "dated", "tenant": "team-d"}
    issued = (await api.post("/v1/tokens", json=body, headers=auth(ADMIN_TOKEN))).json()
    listed = (await api.get("/v1/tokens", headers=auth(ADMIN_TOKEN))).json()
    [same] = [t for t in listed if t["id"] == issued["id"]]
    assert issued["created_at"] is not None
    assert issued["created_at"] == same["created_at"]


async def test_health_readiness_and_metrics_need_no_token(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    assert (await api.get("/readyz")).json() == {"status": "ready"}
    assert "qshare_api_requests_total" in (await api.get("/metrics")).text


async def test_made_up_methods_add_no_metric_series(api: httpx.AsyncClient) -> None:
    """Anyone may send any method, without a token; before, each new one added a counter and
    a histogram of 13 series to the API's memory and to every /metrics answer, without end."""
    before = (await api.get("/metrics")).text.count("\n")
    for i in range(20):
        await api.request(f"M{i}", "/v1/claims")
        await api.request(f"X{i}", f"/nowhere/{i}")
    text = (await api.get("/metrics")).text
    methods = set(re.findall(r'qshare_api_request[a-z_]*\{method="([^"]*)"', text))
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert "other" in methods
    assert text.count("\n") - before <= 2 * 30  # the `other` series and a GET or two at most


async def test_openapi_documents_every_route_with_examples(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    paths = set(spec["paths"])
    assert {"/v1/claims", "/v1/claims/{claim_id}", "/v1/nodes", "/v1/gpus", "/v1/classes"} <= paths
    assert spec["components"]["schemas"]["ClaimSpec"]["examples"]
    assert "422" in spec["paths"]["/v1/claims"]["post"]["responses"]


def _examples_against_schemas(spec: dict[str, Any]) -> list[str]:
    """Every example the document gives for a schema or one of its fields, checked against that
    schema (OpenAPI 3.1 schemas are JSON Schema 2020-12): what a generated client would check."""
    registry: Registry[Any] = Registry().with_resource(
        "urn:openapi", DRAFT202012.create_resource({"components": spec["components"]})
    )
    wrong = []
    for name, schema in spec["components"]["schemas"].items():
        parts = [
            (name, schema),
            *((f"{name}.{f}", s) for f, s in schema.get("properties", {}).items()),
        ]
        for where, part in parts:
            check = Draft202012Validator(_rooted(part), registry=registry)
            wrong += [
                f"{where}: {e.message}"
                for x in part.get("examples", [])
                for e in check.iter_errors(x)
            ]
    return wrong


def _rooted(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: "urn:openapi" + v if k == "$ref" else _rooted(v) for k, v in schema.items()}
    return [_rooted(x) for x in schema] if isinstance(schema, list) else schema


async def test_openapi_examples_are_valid_under_their_own_schemas(api: httpx.AsyncClient) -> None:
    """Memory fields take '4Gi' as well as integer MiB: their schema must say so, not `integer`
    beside the anyOf (which made every quantity, the document's own examples too, invalid)."""
    spec = (await api.get("/openapi.json")).json()
    assert _examples_against_schemas(spec) == []
    vmemory = spec["components"]["schemas"]["ClaimSpec"]["properties"]["vmemory"]
    assert not Draft202012Validator(vmemory).is_valid("4Gx")
    assert Draft202012Validator(vmemory).is_valid("4Gi") and Draft202012Validator(vmemory).is_valid(
        4096
    )
