"""A small synchronous client for the few Kubernetes API paths the node agent's plugins call
(ResourceClaims, ResourceSlices, Pods); errors carry the API's status and message."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
RESOURCE = "/apis/resource.k8s.io/v1"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


class KubeApi:
    """Thread-safe; each thread keeps its own keep-alive connection (the standard library's
    client: the plugins call from many gRPC threads and a request must stay cheap)."""

    def __init__(
        self,
        server: str,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"API server {server!r} is not an http(s) URL")
        self._host, self._port, self._timeout = url.hostname, url.port, timeout_s
        self._tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            cafile = str(ca_file) if ca_file is not None and ca_file.is_file() else None
            self._tls = ssl.create_default_context(cafile=cafile)
        self._token = _TokenFile(token_file)
        self._local = threading.local()
        self._all: weakref.WeakSet[_Kept] = weakref.WeakSet()  # each thread's, while it lives
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        """A request's headers, with the service account token as the file holds it now."""
        headers = {"Accept": "application/json"}
        token = self._token.read()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def close(self) -> None:
        with self._lock:
            for kept in list(self._all):
                kept.conn.close()
            self._all.clear()

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout_s, context=self._tls
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _connection(self) -> http.client.HTTPConnection:
        kept: _Kept | None = getattr(self._local, "kept", None)
        if kept is None:
            kept = self._local.kept = _Kept(self._connect(self._timeout))
            with self._lock:
                self._all.add(kept)
        return kept.conn

    def _drop(self) -> None:
        """Close this thread's connection and forget it (the next request opens another)."""
        kept: _Kept | None = getattr(self._local, "kept", None)
        if kept is not None:
            kept.conn.close()
            self._local.kept = None
            with self._lock:
                self._all.discard(kept)  # gone already if `close()` came first

    def request(
        self, method: str, path: str, body: Any = None, patch: bool = False
    ) -> dict[str, Any]:
        """The answer's JSON object; an error status, a failed exchange, or a body that is
        no JSON object (every path called here answers one) raises `ApiError`."""
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers()
        if data is not None:
            headers["Content-Type"] = MERGE_PATCH if patch else "application/json"
        for attempt in range(2):  # a kept-alive connection the server closed is reopened once
            try:
                conn = self._connection()
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if attempt:
                    raise ApiError(0, f"{method} {path} failed: {exc}") from None
        if resp.status >= 400:
            raise ApiError(resp.status, _message(raw))
        return _object(method, path, raw)

    def resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
        )
        return result

    def resource_claims(self) -> tuple[list[dict[str, Any]], str]:
        """Every namespace's ResourceClaims and the list's resourceVersion (to watch from)."""
        result = self.request("GET", f"{RESOURCE}/resourceclaims")
        items: list[dict[str, Any]] = result.get("items") or []
        return items, str((result.get("metadata") or {}).get("resourceVersion", ""))

    def resource_slice_names(self, name: str) -> tuple[set[str], str]:
        """Which of the slices named `name` exist (none or it) and the list's
        resourceVersion (to watch from)."""
        query = urllib.parse.urlencode({"fieldSelector": f"metadata.name={name}"})
        result = self.request("GET", f"{RESOURCE}/resourceslices?{query}")
        items: list[dict[str, Any]] = result.get("items") or []
        names = {str((i.get("metadata") or {}).get("name")) for i in items}
        return names & {name}, str((result.get("metadata") or {}).get("resourceVersion", ""))

    def watch_resource_slice(self, name: str, resource_version: str, timeout_s: int) -> Watch:
        """The changes to the ResourceSlice `name` after `resource_version`."""
        query = urllib.parse.urlencode(
            {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": timeout_s,
             "fieldSelector": f"metadata.name={name}", "allowWatchBookmarks": "true"}
        )  # fmt: skip
        return Watch(self, f"{RESOURCE}/resourceslices?{query}", timeout_s)

    def watch_resource_claims(self, resource_version: str, timeout_s: int) -> Watch:
        """The changes to every namespace's ResourceClaims after `resource_version`."""
        query = urllib.parse.urlencode(
            {"watch": "true", "resourceVersion": resource_version,
             "timeoutSeconds": timeout_s, "allowWatchBookmarks": "true"}
        )  # fmt: skip
        return Watch(self, f"{RESOURCE}/resourceclaims?{query}", timeout_s)

    def resource_slice(self, name: str) -> dict[str, Any] | None:
        """The ResourceSlice `name`, or None where there is none."""
        try:
            return self.request("GET", f"{RESOURCE}/resourceslices/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            return None

    def apply_resource_slice(self, body: dict[str, Any]) -> int:
        """Create the slice, or replace it keeping the server's resourceVersion; the pool
        generation only grows (a restarted plugin continues after the published one).
        Returns the generation written."""
        name = body["metadata"]["name"]
        pool = body["spec"]["pool"]
        try:
            current = self.request("GET", f"{RESOURCE}/resourceslices/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.request("POST", f"{RESOURCE}/resourceslices", body)
            return int(pool["generation"])
        published = int(current.get("spec", {}).get("pool", {}).get("generation", 0))
        pool["generation"] = max(int(pool["generation"]), published + 1)
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        self.request("PUT", f"{RESOURCE}/resourceslices/{name}", body)
        return int(pool["generation"])

    def node(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{name}")
        return result

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


class _Kept:
    """A thread's keep-alive connection, held by that thread's local storage only: it is
    closed when the thread ends (the plugins' gRPC pools are made again with every kubelet
    restart), not left open until the client closes."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        weakref.finalize(self, conn.close)


class _TokenFile:
    """The service account token, read again whenever its file changes: the kubelet
    replaces a projected token before it expires (an hour by default), and a client that
    kept the first one is refused once it has (client-go reads the file again too)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""

    def read(self) -> str:
        """The token ("" with no file); the last one read while the file cannot be read."""
        if self._path is None:
            return ""
        try:
            stat = os.stat(self._path)
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                self._token, self._seen = self._path.read_text().strip(), seen
        except OSError:
            pass
        return self._token


class Watch:
    """One watch request on its own connection: iterate it for the events (`type`,
    `object`); `close()` from any thread ends the iteration. An `ERROR` event (such as 410
    Gone for a version the server no longer has) raises `ApiError` with its code."""

    def __init__(self, api: KubeApi, path: str, timeout_s: int) -> None:
        # the server ends the watch after timeout_s; the socket waits a little longer
        self._conn = api._connect(timeout_s + 10.0)
        self._path = path
        self._headers = api.headers()
        self._closed = False

    def close(self) -> None:
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            self._conn.request("GET", self._path, headers=self._headers)
            resp = self._conn.getresponse()
            if resp.status >= 400:
                raise ApiError(resp.status, _message(resp.read()))
            while not self._closed and (line := resp.readline()):
                if line.strip():
                    yield _checked(json.loads(line))
        except ApiError:
            raise
        except Exception as exc:  # a stream cut mid-chunk fails in many ways; all end it
            if not self._closed:
                raise ApiError(0, f"watch {self._path} failed: {exc!r}") from None
        finally:
            self._conn.close()


def _checked(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ApiError(0, f"a watch event is not an object with an object: {event!r:.200}")
    if event.get("type") == "ERROR":
        status = event["object"]
        raise ApiError(int(status.get("code") or 0), str(status.get("message", "watch error")))
    return event


def _object(method: str, path: str, raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ApiError(0, f"{method} {path} answered {raw[:100]!r}, which is not a JSON object")
    return answer


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("message") or raw.decode(errors="replace"))
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")[:200]
