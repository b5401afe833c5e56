"""A reused idempotency key must come with the same request: otherwise the caller would
silently get a claim it did not ask for (say, a high-priority one for a low one)."""

from __future__ import annotations

from qshare.contracts.claims import ClaimSpec, ClaimView
from qshare.contracts.errors import Conflict, FieldError


def ensure_same_request(known: ClaimView, spec: ClaimSpec) -> None:
    """Raise Conflict naming each field where `spec` differs from the claim the key named."""
    asked = {
        "priority": spec.priority,
        "vcore": spec.vcore,
        "vmemory": spec.vmemory,
        "count": spec.count,
        "class_name": spec.class_name,
        "node_selector": spec.node_selector,
        "placement": spec.placement,
        "gang": spec.gang,
    }
    stored = {
        "priority": known.priority,
        "vcore": known.vcore,
        "vmemory": known.vmemory_mib,
        "count": known.count,
        "class_name": known.class_name,
        "node_selector": known.node_selector,
        "placement": known.placement,
        "gang": known.gang,
    }
    errors = [
        FieldError(field=f, message=f"{asked[f]!r} differs from {stored[f]!r} of claim {known.id}")
        for f in asked
        if asked[f] != stored[f]
    ]
    if errors:
        fields = ", ".join(e.field for e in errors)
        raise Conflict(f"idempotency key {spec.idempotency_key!r} was used for another request "
                       f"(differs in {fields})", errors)  # fmt: skip
