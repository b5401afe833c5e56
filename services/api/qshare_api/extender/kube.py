"""The Kubernetes API calls the extender makes: bind reads the pod, annotates it and binds
it; the reaper lists pods. Every write to a pod names the pod instance it is meant for (its
uid, as a precondition the API server checks), so a pod deleted and re-created under the
same name is never written in its predecessor's place. A `Kube` is made per bind or sweep
(so a rotated service account token is read again), over one TLS context per CA file:
building a context costs ~35 ms of CPU, which on the event loop would stall every filter
and prioritize in flight."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import httpx

from qshare_api.extender.settings import ExtenderSettings


class KubeError(Exception):
    """A failed call; `status` is the API server's HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class PodReplaced(KubeError):
    """The pod was deleted, or deleted and re-created under the same name (another uid),
    since it was read: a write meant for it was refused."""


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
                f"{method} {path}: Kubernetes answered {resp.status_code}: {_message(resp)}",
                resp.status_code,
            )
        return resp.json() if resp.content else None

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return found

    async def pod_or_none(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when there is none of the name."""
        try:
            return await self.pod(namespace, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def pods(self, namespace: str) -> list[dict[str, Any]]:
        found = await self._call("GET", f"/api/v1/namespaces/{namespace}/pods")
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def annotate(
        self, namespace: str, name: str, uid: str, notes: Mapping[str, str | None]
    ) -> None:
        """Merge `notes` into the annotations of the pod instance `uid` (None removes one).
        The uid in the patch is a precondition: the API server refuses (422, the uid being
        immutable) a patch for a pod re-created under the name, and answers 404 for a
        deleted one; both raise `PodReplaced`. No resourceVersion: the patch names only
        qshare's own keys, so a concurrent change to the pod's other fields is kept, not a
        reason to fail."""
        patch = {"metadata": {"uid": uid, "annotations": notes}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await _conditional(self._call("PATCH", path, patch, merge=True), (404, 422), "annotated")

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind the pod instance `uid` to `node`. The Binding's uid is a precondition: 404
        (no pod of the name) raises `PodReplaced`; 409 Conflict (another instance, or the
        pod already assigned) is a `KubeError` of status 409 for the caller to settle."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
        await _conditional(self._call("POST", path, body), (404,), "bound")


async def _conditional(call: Awaitable[Any], replaced: tuple[int, ...], step: str) -> None:
    """Await a conditional write; the statuses in `replaced` mean its pod is not there."""
    try:
        await call
    except KubeError as exc:
        if exc.status in replaced:
            why = f"was deleted or re-created under its name before it was {step} ({exc})"
            raise PodReplaced(why, exc.status) from None
        raise


def _message(resp: httpx.Response) -> str:
    """The message of the API server's `Status` answer, else the body's start."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return resp.text[:200]
