"""The Kubernetes API calls the extender makes: bind reads the pod, annotates it and binds
it; the reaper lists pods. A `Kube` is made per bind or sweep (so a rotated service account
token is read again), over one TLS context per CA file: building a context costs ~35 ms of
CPU, which on the event loop would stall every filter and prioritize in flight."""

from __future__ import annotations

import functools
import ssl
from pathlib import Path
from typing import Any

import httpx

from qshare_api.extender.settings import ExtenderSettings


class KubeError(Exception):
    pass


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """The context verifying the API server: by `ca_file` when it exists (built again when
    the file changes), else as httpx verifies by default."""
    if ca_file is not None and ca_file.is_file():
        return _context(str(ca_file), ca_file.stat().st_mtime_ns)
    return _context(None, 0)


@functools.lru_cache(maxsize=4)
def _context(ca_file: str | None, mtime_ns: int) -> ssl.SSLContext:
    if ca_file is None:
        return httpx.create_ssl_context()
    return ssl.create_default_context(cafile=ca_file)


class Kube:
    def __init__(self, settings: ExtenderSettings) -> None:
        headers = {"Accept": "application/json"}
        token = settings.token_file
        if token is not None and token.is_file():
            headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        self.tls = tls_context(settings.ca_file)
        self._http = httpx.AsyncClient(
            base_url=settings.api_server, headers=headers, verify=self.tls,
            timeout=settings.timeout_s,
        )  # fmt: skip

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
