"""A small synchronous client for the few Kubernetes API paths the plugins and the extender
call (ResourceClaims, ResourceSlices, Pods); errors carry the API's status and message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

MERGE_PATCH = "application/merge-patch+json"
RESOURCE = "/apis/resource.k8s.io/v1"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


class KubeApi:
    def __init__(
        self,
        server: str,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        headers = {"Accept": "application/json"}
        if token_file is not None and token_file.is_file():
            headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        verify: str | bool = str(ca_file) if ca_file is not None and ca_file.is_file() else True
        self._http = httpx.Client(
            base_url=server, headers=headers, verify=verify, timeout=timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: Any = None, patch: bool = False) -> Any:
        headers = {"Content-Type": MERGE_PATCH} if patch else {}
        try:
            resp = self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"{method} {path} failed: {exc}") from None
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _message(resp))
        return resp.json() if resp.content else None

    def resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
        )
        return result

    def apply_resource_slice(self, body: dict[str, Any]) -> None:
        """Create the slice, or replace it keeping the server's resourceVersion."""
        name = body["metadata"]["name"]
        try:
            current = self.request("GET", f"{RESOURCE}/resourceslices/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.request("POST", f"{RESOURCE}/resourceslices", body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        self.request("PUT", f"{RESOURCE}/resourceslices/{name}", body)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        result = self.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        items: list[dict[str, Any]] = result.get("items", [])
        return items

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return result

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch; one carrying metadata.resourceVersion fails with 409 if the pod
        changed since it was read (compare-and-swap)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        result: dict[str, Any] = self.request("PATCH", path, patch, patch=True)
        return result

    def bind_pod(self, namespace: str, name: str, node: str, uid: str | None) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("message") or resp.text)
    except ValueError:
        return resp.text[:200]
