"""The three Kubernetes API calls bind makes: read the pod, annotate it, bind it."""

from __future__ import annotations

from typing import Any

import httpx

from qshare_api.extender.settings import ExtenderSettings


class KubeError(Exception):
    pass


class Kube:
    def __init__(self, settings: ExtenderSettings) -> None:
        headers = {"Accept": "application/json"}
        token = settings.token_file
        if token is not None and token.is_file():
            headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        ca = settings.ca_file
        verify: str | bool = str(ca) if ca is not None and ca.is_file() else True
        self._http = httpx.AsyncClient(
            base_url=settings.api_server, headers=headers, verify=verify, timeout=settings.timeout_s
        )

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, merge: bool = False) -> Any:
        headers = {"Content-Type": "application/merge-patch+json"} if merge else {}
        try:
            resp = await self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise KubeError(f"{method} {path}: {exc}") from None
        if resp.status_code >= 400:
            raise KubeError(
                f"{method} {path}: Kubernetes answered {resp.status_code}: {resp.text[:200]}"
            )
        return resp.json() if resp.content else None

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return found

    async def pods(self, namespace: str) -> list[dict[str, Any]]:
        found = await self._call("GET", f"/api/v1/namespaces/{namespace}/pods")
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def annotate(self, namespace: str, name: str, notes: dict[str, str]) -> None:
        patch = {"metadata": {"annotations": notes}}
        await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", patch, merge=True)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or None},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)
