"""What a pod asks of qshare: `qshare.io/vcore` and `qshare.io/vmemory` in its containers'
resources, priority from the `qshare.io/priority` annotation."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from qshare.contracts.claims import ClaimSpec

VCORE = "qshare.io/vcore"
VMEMORY = "qshare.io/vmemory"
PRIORITY = "qshare.io/priority"


class PodError(ValueError):
    """The pod's qshare request is malformed; the message names what."""


def _field(obj: Any, key: str, what: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodError(f"{what} must be an object")
    return value


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    containers = _field(pod, "spec", "pod.spec").get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise PodError("pod.spec.containers must be a list of containers")
    return containers


def _asked(container: dict[str, Any], name: str) -> str | None:
    res = _field(container, "resources", "container resources")
    limits = _field(res, "limits", "resources.limits")
    value = limits.get(name) or _field(res, "requests", "resources.requests").get(name)
    return None if value is None else str(value)


def uid(pod: dict[str, Any]) -> str:
    """The pod's uid ("" when it has none)."""
    return str(_field(pod, "metadata", "pod.metadata").get("uid") or "")


def node_name(pod: dict[str, Any]) -> str:
    """The node the pod is bound to ("" when it is not bound)."""
    return str(_field(pod, "spec", "pod.spec").get("nodeName") or "")


def notes_of(pod: dict[str, Any]) -> dict[str, Any]:
    return _field(_field(pod, "metadata", "pod.metadata"), "annotations", "annotations")


def wants_qshare(pod: dict[str, Any]) -> bool:
    return any(_asked(c, VCORE) or _asked(c, VMEMORY) for c in _containers(pod))


def claim_spec(pod: dict[str, Any], vmemory_unit_mib: int, key: str | None = None) -> ClaimSpec:
    """The claim of the pod's one qshare container (one vGPU per container)."""
    containers = [c for c in _containers(pod) if _asked(c, VCORE)]
    if len(containers) != 1:
        raise PodError(f"exactly one container must ask for {VCORE}, found {len(containers)}")
    vcore, memory = _asked(containers[0], VCORE), _asked(containers[0], VMEMORY)
    notes = notes_of(pod)
    try:
        units = int(memory or 0)
        return ClaimSpec.model_validate(
            {
                "priority": notes.get(PRIORITY, "low"),
                "vcore": int(vcore or 0),
                "vmemory": units * vmemory_unit_mib,
                "idempotency_key": key,
            }
        )
    except ValueError as exc:
        raise PodError(_message(exc)) from None


def _message(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        field = {"vcore": VCORE, "vmemory": VMEMORY, "priority": PRIORITY}.get(
            str(err["loc"][0]), str(err["loc"][0])
        )
        return f"{field}: {err['msg']}"
    return f"{VCORE} and {VMEMORY} must be whole numbers: {exc}"
