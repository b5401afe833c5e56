"""Every REST operation, fed a valid request with one body field, path parameter or query
parameter at a time turned hostile (gone, null, wrong type, huge, NUL, NaN, ...), answers a
problem document or success — never a 5xx. Deterministic, where `test_openapi_fuzz.py`
samples: each field meets each hostile value once."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth
from tests.controlplane.hostile import variants

ADMIN = auth(ADMIN_TOKEN)
HOSTILE_TEXT = ("\x00", "%00", "..", "../etc", " ", "é" * 300, "x" * 5000, "*", ">", "a.b")
"""What each path or query parameter is replaced by, one at a time."""
CLASS_CHANGE = {"description": "slices", "evictable": True, "eviction_grace_s": 30}


def _body_seeds(claim_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    spec = {"priority": "low", "vcore": 10, "vmemory": "1Gi", "count": 1,
            "class_name": "qshare", "node_selector": {}, "idempotency_key": "fuzz",
            "placement": {"node": "spread", "card": "binpack"}, "gang": "fuzz"}  # fmt: skip
    cards = [{"uuid": "fzr-g0", "index": 0, "model": "A100", "memory": "16Gi"}]
    sharing = {"policy": "burst-share", "release_mode": "auto", "release_delay_s": 0.1,
               "release_auto_bound_s": 0.01, "lp_window_s": 0.001,
               "lp_device_gate": True}  # fmt: skip
    return [
        ("POST", "/v1/claims", spec),
        ("PATCH", f"/v1/claims/{claim_id}", {"vcore": 20, "vmemory": "2Gi"}),
        ("POST", "/v1/nodes", {"name": "fzr", "labels": {"zone": "a"}, "gpus": cards}),
        ("PATCH", "/v1/nodes/fz", {"schedulable": True}),
        ("PATCH", "/v1/gpus/fz-g0/sharing", sharing),
        ("POST", "/v1/tokens", {"name": "fuzz", "tenant": "team-z", "role": "tenant"}),
        ("PUT", "/v1/quotas/team-z", {"memory": "64Gi", "cards": 4, "pending": 2}),
        ("PATCH", "/v1/quotas/team-z", {"cards": 8}),
        ("PATCH", "/v1/classes/fuzz", CLASS_CHANGE),
    ]


def _paths(claim_id: str) -> list[tuple[str, str]]:
    """(method, path with `{}` where the hostile parameter goes)."""
    return [
        ("GET", "/v1/claims/{}"), ("PATCH", "/v1/claims/{}"), ("DELETE", "/v1/claims/{}"),
        ("POST", "/v1/claims/{}/suspend"), ("POST", "/v1/claims/{}/resume"),
        ("GET", "/v1/nodes/{}"), ("PATCH", "/v1/nodes/{}"), ("DELETE", "/v1/nodes/{}"),
        ("DELETE", "/v1/nodes/fz/gpus/{}"), ("DELETE", "/v1/nodes/{}/gpus/fz-g1"),
        ("GET", "/v1/gpus/{}"), ("PATCH", "/v1/gpus/{}/sharing"),
        ("DELETE", "/v1/gpus/{}/sharing"), ("DELETE", "/v1/tokens/{}"),
        ("PUT", "/v1/quotas/{}"), ("PATCH", "/v1/quotas/{}"), ("DELETE", "/v1/quotas/{}"),
        ("PATCH", "/v1/classes/{}"), ("DELETE", "/v1/classes/{}"),
        ("GET", "/v1/claims?status={}"), ("GET", "/v1/claims?priority={}"),
        ("GET", "/v1/claims?node={}"), ("GET", "/v1/claims?tenant={}"),
        ("GET", "/v1/claims?limit={}"), ("GET", "/v1/claims?cursor={}"),
        ("GET", "/v1/gpus?node={}"), ("GET", "/v1/me/quota?tenant={}"),
        ("GET", "/v1/tokens?limit={}"), ("GET", "/v1/tokens?limit=2&cursor={}"),
        ("GET", "/v1/quotas?limit={}"), ("GET", "/v1/quotas?limit=2&cursor={}"),
        ("GET", "/v1/nodes?limit={}"), ("GET", "/v1/nodes?limit=2&cursor={}"),
        ("GET", "/v1/gpus?limit={}"), ("GET", "/v1/gpus?limit=2&cursor={}"),
        ("GET", "/v1/preemptions?claim={}"), ("GET", "/v1/preemptions?kind={}"),
        ("GET", "/v1/preemptions?limit={}"), ("GET", "/v1/starvation?claim={}"),
        ("GET", f"/v1/starvation?claim={claim_id}&limit={{}}"),
    ]  # fmt: skip


@pytest.fixture
async def claim_id(register: Register, claim: Claim) -> str:
    await register("fz", cards=2)
    return str((await claim(priority="low")).id)


async def _server_errors(api: httpx.AsyncClient, method: str, path: str, data: Any) -> str | None:
    body = json.dumps(data).encode()
    headers = ADMIN | {"content-type": "application/json"}
    response = await api.request(method, path, content=body, headers=headers)
    return None if response.status_code < 500 else f"{response.status_code} {response.text}"


async def test_hostile_body_fields_are_answered_without_a_server_error(
    api: httpx.AsyncClient, claim_id: str
) -> None:
    fuzz_class = {"name": "fuzz", "provisioner": "qshare"}  # a class of its own to change
    assert (await api.post("/v1/classes", json=fuzz_class, headers=ADMIN)).status_code < 500
    bad = []
    for method, path, seed in _body_seeds(claim_id):
        for what, data in variants(seed):
            if (error := await _server_errors(api, method, path, data)) is not None:
                bad.append(f"{method} {path}: {what}: {error[:200]}")
    assert bad == [], "\n".join(bad)


async def test_hostile_path_and_query_parameters_are_answered_without_a_server_error(
    api: httpx.AsyncClient, claim_id: str
) -> None:
    bad = []
    for method, template in _paths(claim_id):
        for value in HOSTILE_TEXT:
            path = template.format(quote(value, safe=""))
            body = {"vcore": 20} if method in ("PATCH", "PUT") else None
            if (error := await _server_errors(api, method, path, body)) is not None:
                bad.append(f"{method} {template} with {value!r:.20}: {error[:200]}")
    assert bad == [], "\n".join(bad)
