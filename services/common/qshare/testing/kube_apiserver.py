"""A test double of the Kubernetes API server for the few resource.k8s.io and core paths
qshare calls: a loopback HTTP server holding objects by path, with create, replace, merge
patch, delete, pod binding, a pod list by node, and LIST + WATCH of a collection as the real
server speaks them: a list carries the collection's resourceVersion;
`?watch=true&resourceVersion=N` streams every later change as newline-delimited JSON events
(`ADDED`, `MODIFIED`, `DELETED`) over a chunked response until `timeoutSeconds`, and answers
a version older than its history with an `ERROR` event of status 410 (Gone), after which a
client lists again. No admission, no authentication: it stands in for the API server in
tests and benchmarks only.

Preconditions answer as the real server does: a merge patch carrying a stale
metadata.resourceVersion gets 409 Conflict (reason `Conflict`); one carrying another object's
metadata.uid (the name now holds a re-created object) gets 422 (reason `Invalid`, "field is
immutable"), the version being checked first; a Binding whose metadata.uid is not the pod's
gets 409 Conflict ("Precondition failed: UID in precondition"), as does binding a pod that is
already assigned to a node.

A ResourceSlice is checked as the real server checks it before it is stored (create or
replace): what its OpenAPI schema cannot say (`resource_slice_rules`) gets 422 Invalid."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from qshare.testing.resource_slice_rules import slice_errors

HISTORY = 10_000  # watch events kept; a watch from an older version gets 410 Gone
Event = tuple[int, str, str, dict[str, Any]]  # resourceVersion, type, path, object


class ApiServerDouble:
    """Objects by path (`/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/name`)."""

    def __init__(self, history: int = HISTORY) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._version = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._events: deque[Event] = deque(maxlen=history)
        self._closing = False
        self.lose_patch_answers = 0  # the next n PATCHes are applied but not answered
        self.lose_post_answers = 0  # the next n POSTs (a Binding too) likewise
        self.fail_gets = 0  # the next n GETs (not watches) answer 503, as a failing server
        self.fail_posts = 0  # the next n POSTs answer 503 and are not applied
        self.before_patch: Callable[[str], None] | None = None
        """Called with a PATCH's path before it is applied (a change racing the client's)."""
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
                base, _, query = self.path.partition("?")
                params = urllib.parse.parse_qs(query)
                if params.get("watch", [""])[0] in ("true", "1"):
                    self._stream(double.watch(base, params))
                elif double.take_lost_answer("fail_gets"):
                    self._reply(503, _status(503, "ServiceUnavailable", "etcd timed out"))
                else:
                    self._reply(*double.get(self.path))

            def do_DELETE(self) -> None:
                self._reply(*double.delete(self.path))

            def _stream(self, events: Iterator[dict[str, Any]]) -> None:
                """Each event one JSON line in its own chunk, flushed as it happens."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in events:
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass  # the client went away
                self.close_connection = True

            def do_POST(self) -> None:
                answer = double.post(self.path, self._body())
                if double.take_lost_answer("lose_post_answers"):
                    self.close_connection = True  # applied, but the client never hears
                    return
                self._reply(*answer)

            def do_PUT(self) -> None:
                self._reply(*double.put(self.path, self._body()))

            def do_PATCH(self) -> None:
                if double.before_patch is not None:
                    double.before_patch(self.path)
                answer = double.patch(self.path, self._body())
                if double.take_lost_answer():
                    self.close_connection = True  # applied, but the client never hears
                    return
                self._reply(*answer)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def put_object(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self._store(path, body)

    def delete_object(self, path: str) -> None:
        self.delete(path)

    def _store(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        kind = "MODIFIED" if path in self.objects else "ADDED"
        self.objects[path] = body
        self._record(kind, path, body)
        return body

    def _record(self, kind: str, path: str, body: dict[str, Any]) -> None:
        self._events.append((self._version, kind, path, json.loads(json.dumps(body))))
        self._changed.notify_all()

    def delete(self, path: str) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("DELETE", path))
            gone = self.objects.pop(path, None)
            if gone is None:
                return 404, {"kind": "Status", "message": f"{path} not found", "code": 404}
            self._version += 1
            self._record("DELETED", path, gone)
            return 200, gone

    def watch(self, collection: str, params: dict[str, list[str]]) -> Iterator[dict[str, Any]]:
        """The events of `collection` after `resourceVersion` (all current objects as
        ADDED when it is absent or 0), until `timeoutSeconds` or close."""
        timeout = float(params.get("timeoutSeconds", ["300"])[0])
        since = int(params.get("resourceVersion", ["0"])[0] or 0)
        deadline = time.monotonic() + timeout
        with self._lock:
            self.requests.append(("WATCH", collection))
            expired = bool(self._events) and 0 < since < self._events[0][0] - 1
            if since == 0:
                pending = [
                    (self._version, "ADDED", p, o)
                    for p, o in self.objects.items()
                    if _in_collection(collection, p)
                ]
                since = self._version
            else:
                pending = []
        if expired:
            yield _gone()
            return
        yield from (_event(kind, obj) for _v, kind, _p, obj in pending)
        while (left := deadline - time.monotonic()) > 0:
            with self._lock:
                fresh = [e for e in self._events if e[0] > since]
                if not fresh and not self._closing:
                    self._changed.wait(left)
                    fresh = [e for e in self._events if e[0] > since]
                if self._closing:
                    return
            for version, kind, path, obj in fresh:
                since = version
                if _in_collection(collection, path):
                    yield _event(kind, obj)

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
            if _is_collection(base):
                items = [o for p, o in self.objects.items() if _in_collection(base, p)]
                meta = {"resourceVersion": str(self._version)}
                return 200, {"kind": "List", "metadata": meta, "items": items}
            return 404, {"kind": "Status", "message": f"{base} not found", "code": 404}

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.take_lost_answer("fail_posts"):
            return 503, _status(503, "ServiceUnavailable", "etcd timed out")
        with self._lock:
            self.requests.append(("POST", path))
            if path.endswith("/binding"):
                return self._bind(path.removesuffix("/binding"), body)
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, {"message": f"{target} already exists"}
            refused = _invalid(target, body, None)
            if refused is not None:
                return refused
            return 201, self._store(target, body)

    def put(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("PUT", path))
            current = self.objects.get(path)
            if current is None:
                return 404, {"message": f"{path} not found"}
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, {"message": "the object has been modified"}
            refused = _invalid(path, body, current)
            if refused is not None:
                return refused
            return 200, self._store(path, body)

    def take_lost_answer(self, counter: str = "lose_patch_answers") -> bool:
        """True (once per count of `counter`) when a request's answer is to be lost (or
        failed: `fail_gets`, `fail_posts`)."""
        with self._lock:
            left: int = getattr(self, counter)
            if left <= 0:
                return False
            setattr(self, counter, left - 1)
            return True

    def patch(self, path: str, patch: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(("PATCH", path))
            current = self.objects.get(path)
            if current is None:
                return 404, {"message": f"{path} not found"}
            refused = _unmet(path, current, patch.get("metadata") or {})
            if refused is not None:
                return refused
            return 200, self._store(path, _merge(current, patch))

    def _bind(self, pod_path: str, binding: dict[str, Any]) -> tuple[int, Any]:
        """The binding subresource: the Binding's uid is a precondition on the pod."""
        pod = self.objects.get(pod_path)
        name = pod_path.rsplit("/", 1)[-1]
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        meta, spec = pod.setdefault("metadata", {}), pod.setdefault("spec", {})
        wanted = (binding.get("metadata") or {}).get("uid")
        if wanted and wanted != meta.get("uid"):
            why = (
                f"Precondition failed: UID in precondition: {wanted}, "
                f"UID in object meta: {meta.get('uid', '')}"
            )
            return 409, _conflict("pods/binding", name, why)
        if spec.get("nodeName"):
            why = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
            return 409, _conflict("pods/binding", name, why)
        spec["nodeName"] = binding["target"]["name"]
        self._store(pod_path, pod)
        return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}


def _unmet(path: str, current: dict[str, Any], meta: dict[str, Any]) -> tuple[int, Any] | None:
    """The real server's answer to a patch whose metadata preconditions `current` does not
    meet (None when it meets them): the resourceVersion first (409), then the uid (422)."""
    name = path.rsplit("/", 1)[-1]
    have = current.get("metadata", {})
    version = meta.get("resourceVersion")
    if version is not None and version != have.get("resourceVersion"):
        why = (
            "the object has been modified; please apply your changes to the latest version "
            "and try again"
        )
        return 409, _conflict(_rest(path)[-2], name, why)
    uid = meta.get("uid")
    if uid is not None and uid != have.get("uid"):
        kind = str(current.get("kind") or _rest(path)[-2])
        message = (
            f'{kind} "{name}" is invalid: metadata.uid: Invalid value: "{uid}": field is immutable'
        )
        return 422, _status(422, "Invalid", message)
    return None


def _invalid(path: str, body: dict[str, Any], old: dict[str, Any] | None) -> tuple[int, Any] | None:
    """422 Invalid for a ResourceSlice the real server would refuse (None: not refused)."""
    if _rest(path)[:1] != ["resourceslices"]:
        return None
    errors = slice_errors(body, old)
    if not errors:
        return None
    name = path.rsplit("/", 1)[-1]
    message = f'ResourceSlice.resource.k8s.io "{name}" is invalid: ' + "; ".join(errors)
    return 422, _status(422, "Invalid", message)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def _conflict(resource: str, name: str, why: str) -> dict[str, Any]:
    return _status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}')


def _rest(path: str) -> list[str]:
    """The path's segments after its group and version (`/apis/g/v/...`, `/api/v1/...`)."""
    parts = path.strip("/").split("/")
    return parts[3:] if parts[:1] == ["apis"] else parts[2:]


def _is_collection(path: str) -> bool:
    rest = _rest(path)
    return len(rest) == 1 or (len(rest) == 3 and rest[0] == "namespaces")


def _in_collection(collection: str, path: str) -> bool:
    """`path` is an object of `collection` (a namespaced one, or every namespace's)."""
    rest, want = _rest(path), _rest(collection)
    prefix = collection.rstrip("/").removesuffix("/".join(want)).rstrip("/")
    if not path.startswith(prefix + "/"):
        return False
    if len(want) == 3:
        return rest[:3] == want and len(rest) == 4
    named = len(rest) == 4 and rest[0] == "namespaces" and rest[2] == want[0]
    return named or (len(rest) == 2 and rest[0] == want[0])


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def _gone() -> dict[str, Any]:
    status = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
              "message": "too old resource version"}  # fmt: skip
    return _event("ERROR", status)


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
