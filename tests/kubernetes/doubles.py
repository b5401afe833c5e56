"""Test doubles for the two sides of Kubernetes the plugins talk to, speaking the real wire
protocols: `KubeletDouble` calls our plugins over their unix sockets with the kubelet's gRPC
messages; `ApiServerDouble` is a loopback HTTP server holding the few resource.k8s.io and
core objects the code reads and writes (no admission, no watch: a test double)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc

from qshare_node_agent.kubernetes import wire


class ApiServerDouble:
    """Objects by path (`/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/name`)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._version = 0
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def do_GET(self) -> None:
                self._reply(*double.get(self.path))

            def do_POST(self) -> None:
                self._reply(*double.post(self.path, self._body()))

            def do_PUT(self) -> None:
                self._reply(*double.put(self.path, self._body()))

            def do_PATCH(self) -> None:
                self._reply(*double.patch(self.path, self._body()))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def put_object(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self._store(path, body)

    def _store(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.objects[path] = body
        return body

    def get(self, path: str) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("GET", path))
            base, _, query = path.partition("?")
            if base.endswith("/pods") and query:
                node = re.search(r"spec.nodeName%3D([^&]+)", query)
                items = [
                    o for p, o in self.objects.items()
                    if "/pods/" in p and node and o.get("spec", {}).get("nodeName") == node.group(1)
                ]  # fmt: skip
                return 200, {"kind": "PodList", "items": items}
            if base in self.objects:
                return 200, self.objects[base]
            return 404, {"kind": "Status", "message": f"{base} not found", "code": 404}

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("POST", path))
            if path.endswith("/binding"):
                pod = self.objects.get(path.removesuffix("/binding"))
                if pod is None:
                    return 404, {"message": "pod not found"}
                pod.setdefault("spec", {})["nodeName"] = body["target"]["name"]
                return 201, {"kind": "Status", "status": "Success"}
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, {"message": f"{target} already exists"}
            return 201, self._store(target, body)

    def put(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("PUT", path))
            current = self.objects.get(path)
            if current is None:
                return 404, {"message": f"{path} not found"}
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, {"message": "the object has been modified"}
            return 200, self._store(path, body)

    def patch(self, path: str, patch: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("PATCH", path))
            current = self.objects.get(path)
            if current is None:
                return 404, {"message": f"{path} not found"}
            wanted = patch.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                return 409, {"message": "the object has been modified; please retry"}
            return 200, self._store(path, _merge(current, patch))


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return patch
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class KubeletDouble:
    """The kubelet's side of plugin registration, DRA and the device plugin API."""

    def __init__(self) -> None:
        self._channels: list[grpc.Channel] = []
        self.device_plugins: list[Any] = []  # RegisterRequests received on kubelet.sock
        self._server: grpc.Server | None = None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._server is not None:
            self._server.stop(0).wait()

    def _channel(self, socket: Path) -> grpc.Channel:
        channel = grpc.insecure_channel(wire.unix_target(socket))
        grpc.channel_ready_future(channel).result(timeout=10)
        self._channels.append(channel)
        return channel

    # -- plugin registration (what the plugin watcher does on finding a socket) ----------
    def register_plugin(self, registration_socket: Path, accept: bool = True) -> Any:
        api = wire.api(wire.REGISTRATION)
        calls = wire.stub(api, "Registration", self._channel(registration_socket))
        info = calls["GetInfo"](api.message("InfoRequest"), timeout=5)
        status = api.message("RegistrationStatus", plugin_registered=accept)
        if not accept:
            status.error = "refused by the test kubelet"
        calls["NotifyRegistrationStatus"](status, timeout=5)
        return info

    # -- DRA ------------------------------------------------------------------------------
    def dra(self, socket: Path, version: str = wire.DRA_V1) -> tuple[wire.Api, dict[str, Any]]:
        api = wire.api(version)
        return api, wire.stub(api, "DRAPlugin", self._channel(socket))

    def prepare(
        self, socket: Path, claims: list[tuple[str, str, str]], version: str = wire.DRA_V1
    ) -> Any:
        api, calls = self.dra(socket, version)
        request = api.message("NodePrepareResourcesRequest")
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return calls["NodePrepareResources"](request, timeout=10)

    def unprepare(
        self, socket: Path, claims: list[tuple[str, str, str]], version: str = wire.DRA_V1
    ) -> Any:
        api, calls = self.dra(socket, version)
        request = api.message("NodeUnprepareResourcesRequest")
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return calls["NodeUnprepareResources"](request, timeout=10)

    # -- device plugin ----------------------------------------------------------------------
    def serve_device_registration(self, kubelet_socket: Path) -> None:
        """Serve kubelet.sock: record every RegisterRequest."""
        api = wire.api(wire.DEVICE_PLUGIN)

        def register(request: Any, context: grpc.ServicerContext) -> Any:
            self.device_plugins.append(request)
            return api.message("Empty")

        handler = wire.service_handler(api, "Registration", {"Register": register})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{kubelet_socket}")
        self._server.start()

    def device_plugin(self, socket: Path) -> tuple[wire.Api, dict[str, Any]]:
        api = wire.api(wire.DEVICE_PLUGIN)
        return api, wire.stub(api, "DevicePlugin", self._channel(socket))

    def list_and_watch(self, socket: Path) -> Iterator[Any]:
        api, calls = self.device_plugin(socket)
        stream: Iterator[Any] = calls["ListAndWatch"](api.message("Empty"), timeout=30)
        return stream
