"""A test double of the Kubernetes API server for the few resource.k8s.io and core paths
qshare calls: a loopback HTTP server holding objects by path, with create, replace, merge
patch (compare-and-swap on metadata.resourceVersion), pod binding and a pod list by node.
No admission, no watch, no authentication: it stands in for the API server in tests and
benchmarks only."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ApiServerDouble:
    """Objects by path (`/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/name`)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._version = 0
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real API server
            disable_nagle_algorithm = True  # headers and body leave in two writes

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

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
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
            if base.endswith("/pods") and not query:
                items = [o for p, o in self.objects.items() if p.startswith(base + "/")]
                return 200, {"kind": "PodList", "items": items}
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


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 drops them
    daemon_threads = True
