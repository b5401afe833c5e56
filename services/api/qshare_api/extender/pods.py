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


def _asked(container: dict[str, Any], name: str) -> str | None:
    res = container.get("resources") or {}
    value = (res.get("limits") or {}).get(name) or (res.get("requests") or {}).get(name)
    return None if value is None else str(value)


def wants_qshare(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(_asked(c, VCORE) or _asked(c, VMEMORY) for c in containers)


def claim_spec(pod: dict[str, Any], vmemory_unit_mib: int, key: str | None = None) -> ClaimSpec:
    """The claim of the pod's one qshare container (one vGPU per container)."""
    containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if _asked(c, VCORE)]
    if len(containers) != 1:
        raise PodError(f"exactly one container must ask for {VCORE}, found {len(containers)}")
    vcore, memory = _asked(containers[0], VCORE), _asked(containers[0], VMEMORY)
    notes = (pod.get("metadata") or {}).get("annotations") or {}
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
