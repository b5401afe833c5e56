"""Who may call which route, as docs/control-plane.md's table says: every `/v1` route needs a
token, and the admin routes refuse a tenant's token with a 403 (guards against a route added
without its dependency)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from qshare_api.app import create_app
from qshare_api.auth import admin, principal
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import auth

ADMIN_ROUTES = {
    ("POST", "/v1/nodes"), ("PATCH", "/v1/nodes/{name}"), ("DELETE", "/v1/nodes/{name}"),
    ("DELETE", "/v1/nodes/{name}/gpus/{uuid}"), ("PATCH", "/v1/gpus/{uuid}/sharing"),
    ("DELETE", "/v1/gpus/{uuid}/sharing"), ("POST", "/v1/classes"), ("PATCH", "/v1/classes/{name}"),
    ("DELETE", "/v1/classes/{name}"), ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens"), ("DELETE", "/v1/tokens/{token_id}"), ("GET", "/v1/quotas"),
    ("PUT", "/v1/quotas/{tenant:path}"), ("PATCH", "/v1/quotas/{tenant:path}"),
    ("DELETE", "/v1/quotas/{tenant:path}"),
}  # fmt: skip
SAMPLE = {"name": "n1", "uuid": "GPU-x", "token_id": str(uuid.uuid4()), "tenant": "team-b"}


def _calls(dependant: Dependant) -> set[Any]:
    found = {dependant.call}
    for sub in dependant.dependencies:
        found |= _calls(sub)
    return found


def _flat(routes: list[Any]) -> list[APIRoute]:
    """The application's routes, those of included routers too (FastAPI wraps each included
    router in one route of its own, holding the router as `original_router`)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):
            found += _flat(route.original_router.routes)
    return found


def _v1_routes() -> list[tuple[str, str, set[Any]]]:
    routes = _flat(create_app(ApiSettings()).routes)
    found = [
        (method, route.path, _calls(route.dependant))
        for route in routes
        if route.path.startswith("/v1")
        for method in route.methods or ()
    ]
    assert len(found) > 20, "the routes were not found"
    return found


def test_every_v1_route_needs_a_token_and_admin_routes_an_admins() -> None:
    routes = _v1_routes()
    assert all(principal in calls for _, _, calls in routes)
    admins = {(method, path) for method, path, calls in routes if admin in calls}
    assert admins == ADMIN_ROUTES


@pytest.mark.parametrize(("method", "path"), sorted(ADMIN_ROUTES))
async def test_a_tenants_token_on_an_admin_route_is_403(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str], method: str, path: str
) -> None:
    url = path.replace(":path", "").format(**SAMPLE)
    response = await api.request(method, url, headers=auth(tenant_tokens["team-a"]), json={})
    assert response.status_code == 403, (url, response.text)
