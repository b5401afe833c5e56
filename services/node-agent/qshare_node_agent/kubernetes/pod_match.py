"""Which pod an `Allocate` call is for. The device plugin API names no pod, so the plugin
takes the oldest pod on this node that the scheduler extender bound (it carries the
`qshare.io/vgpus` annotation), that nobody has taken yet, and whose container asks for this
many vcores; it takes it with a compare-and-swap on the pod's resourceVersion and uid, so
concurrent allocations never take the same pod, a pod re-created under the name is never
taken in its predecessor's place, and nothing waits on a node-wide lock.

Each take writes a mark of its own (`<taker>/<random>`): when a PATCH's answer is lost and
the client's retry meets 409 (its first try was applied and changed the resourceVersion),
the pod is read again and, if it carries this take's mark, it is this take's pod."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from qshare.contracts.claims import VgpuView
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi

VGPUS = "qshare.io/vgpus"
CLAIM = "qshare.io/claim"
BIND_TIME = "qshare.io/bind-time"
TAKEN = "qshare.io/allocated"
VCORE = "qshare.io/vcore"
MAX_ROUNDS = 5
_views = TypeAdapter(list[VgpuView])


class NoPodError(Exception):
    """No bound pod matches the request; the message says what was looked for."""


@dataclass(frozen=True)
class BoundPod:
    namespace: str
    name: str
    uid: str
    vgpus: list[VgpuView]


def _vcores(pod: dict[str, Any]) -> list[int]:
    asked = []
    for container in pod.get("spec", {}).get("containers", []):
        res = container.get("resources") or {}
        value = (res.get("limits") or {}).get(VCORE) or (res.get("requests") or {}).get(VCORE)
        if value is not None and str(value).isdigit():
            asked.append(int(value))
    return asked


def candidates(pods: list[dict[str, Any]], vcores: int, node: str) -> list[dict[str, Any]]:
    """Bound, not yet taken, not finished pods asking `vcores` whose vGPUs are not another
    node's, oldest binding first."""
    out = []
    for pod in pods:
        meta = pod.get("metadata", {})
        notes = meta.get("annotations") or {}
        live = pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        fresh = meta.get("deletionTimestamp") is None
        ours = VGPUS in notes and not _elsewhere(notes[VGPUS], node)
        if ours and TAKEN not in notes and live and fresh and vcores in _vcores(pod):
            out.append(pod)
    return sorted(out, key=lambda p: p["metadata"]["annotations"].get(BIND_TIME, ""))


def take(api: KubeApi, node: str, vcores: int, taker: str) -> BoundPod:
    """Take the matching pod (compare-and-swap), retrying when another allocation won."""
    mark = f"{taker}/{secrets.token_hex(8)}"
    for _ in range(MAX_ROUNDS):
        for pod in candidates(api.pods_on_node(node), vcores, node):
            if _took(api, pod["metadata"], mark):
                return BoundPod(
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    pod["metadata"].get("uid", ""),
                    _parse(pod),
                )
    raise NoPodError(
        f"no pod on node {node} bound by the qshare extender asks for {vcores} {VCORE}"
    )


def _took(api: KubeApi, meta: dict[str, Any], mark: str) -> bool:
    """Mark the pod as taken by `mark`, unless it changed since it was read (then False:
    someone else took or changed it). An answer that was lost (no answer, or the retry's
    409) is settled by reading the pod again: our own mark on it means our PATCH landed."""
    patch = {
        "metadata": {
            "uid": meta.get("uid", ""),
            "resourceVersion": meta["resourceVersion"],
            "annotations": {TAKEN: mark},
        }
    }
    try:
        api.patch_pod(meta["namespace"], meta["name"], patch)
        return True
    except ApiError as exc:
        if exc.status in (404, 422):
            return False  # deleted (or re-created: 422, uid immutable) since the list
        if exc.status not in (0, 409):
            raise
        failure = exc
    try:
        now = api.pod(meta["namespace"], meta["name"])
    except ApiError as exc:
        if exc.status == 404:
            return False  # gone meanwhile: whoever took it, nothing runs there now
        raise
    if (now["metadata"].get("annotations") or {}).get(TAKEN) == mark:
        return True
    if failure.status == 0:
        raise failure
    return False


def _elsewhere(raw: Any, node: str) -> bool:
    """The annotation names a vGPU of another node (the pod was bound somewhere other than
    where its claim was placed); a malformed one is left for `_parse` to report."""
    try:
        vgpus = json.loads(raw)
    except (TypeError, ValueError):
        return False
    if not isinstance(vgpus, list):
        return False
    return any(isinstance(v, dict) and v.get("node") not in (None, node) for v in vgpus)


def _parse(pod: dict[str, Any]) -> list[VgpuView]:
    raw = pod["metadata"]["annotations"][VGPUS]
    try:
        return _views.validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise NoPodError(
            f"annotation {VGPUS} of pod {pod['metadata']['name']} is malformed: {exc}"
        ) from None
