"""The API server's semantic checks of a resource.k8s.io/v1 ResourceSlice (beyond its OpenAPI
schema), for the API server double: what a real server refuses with 422 Invalid. Our own
reading of the rules of Kubernetes' resource validation (see docs/kubernetes.md for the
version checked); each problem is one message naming the field."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_SUFFIX: dict[str, Fraction | int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_SUFFIX |= {"m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIX |= {"P": 10**15, "E": 10**18}
MAX_ID_LENGTH = 32  # a C identifier in an attribute or capacity name
MAX_STRING_ATTRIBUTE = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_POOL_NAME = 253
PLACEMENT = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64  # when any device of the slice has a taint
MAX_TAINTS = 16  # per device
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")  # None: since Kubernetes 1.35
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def quantity(value: object) -> Fraction | None:
    """A Kubernetes quantity's value (None: not a quantity)."""
    match = _QUANTITY.match(str(value)) if isinstance(value, str | int) else None
    if match is None:
        return None
    return Fraction(match.group(1)) * _SUFFIX.get(match.group(2) or "", 1)


def slice_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the API server would refuse in `obj` (replacing `old` when given)."""
    spec = obj.get("spec") or {}
    errors = _name_errors("metadata.name", (obj.get("metadata") or {}).get("name"), subdomain=True)
    errors += _name_errors("spec.driver", spec.get("driver"), subdomain=True)
    errors += _pool_errors(spec.get("pool") or {})
    errors += _placement_errors(spec)
    if old is not None:
        errors += _immutable_errors(spec, old.get("spec") or {})
    errors += _device_count_errors(spec.get("devices") or [])
    names = [d.get("name") for d in spec.get("devices") or []]
    errors += [f"spec.devices: duplicate device {n!r}" for n in set(names) if names.count(n) > 1]
    for i, device in enumerate(spec.get("devices") or []):
        errors += _device_errors(f"spec.devices[{i}]", device)
    return errors


def _name_errors(field: str, value: object, subdomain: bool = False) -> list[str]:
    pattern, limit = (_DNS_SUBDOMAIN, 253) if subdomain else (_DNS_LABEL, 63)
    if not isinstance(value, str) or not value:
        return [f"{field}: Required value"]
    if len(value) > limit or not pattern.match(value):
        kind = "DNS-1123 subdomain" if subdomain else "DNS-1123 label"
        return [f"{field}: Invalid value {value!r}: must be a {kind}"]
    return []


def _pool_errors(pool: dict[str, Any]) -> list[str]:
    name = pool.get("name")
    errors = []
    if not isinstance(name, str) or not name:
        errors.append("spec.pool.name: Required value")
    elif len(name) > MAX_POOL_NAME:
        errors.append(f"spec.pool.name: Too long: at most {MAX_POOL_NAME} characters")
    else:
        for part in name.split("/"):
            errors += _name_errors("spec.pool.name", part, subdomain=True)
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        errors.append("spec.pool.resourceSliceCount: must be greater than zero")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        errors.append("spec.pool.generation: must be greater than or equal to zero")
    return errors


def _placement_errors(spec: dict[str, Any]) -> list[str]:
    chosen = [f for f in PLACEMENT if spec.get(f) not in (None, False)]
    if spec.get("nodeName") == "":
        return ["spec.nodeName: must be either unset or set to a non-empty string"]
    if len(chosen) != 1:
        return [f"spec: exactly one of {', '.join(PLACEMENT)} is required, got {chosen}"]
    return []


def _immutable_errors(spec: dict[str, Any], old: dict[str, Any]) -> list[str]:
    pool, old_pool = spec.get("pool") or {}, old.get("pool") or {}
    pairs = {
        "spec.driver": (spec.get("driver"), old.get("driver")),
        "spec.nodeName": (spec.get("nodeName"), old.get("nodeName")),
        "spec.pool.name": (pool.get("name"), old_pool.get("name")),
    }
    return [f"{field}: field is immutable" for field, (new, was) in pairs.items() if new != was]


def _device_errors(field: str, device: dict[str, Any]) -> list[str]:
    errors = _name_errors(f"{field}.name", device.get("name"))
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        most = MAX_ATTRIBUTES_AND_CAPACITIES
        errors.append(f"{field}: more than {most} attributes and capacities together")
    for name, value in attributes.items():
        errors += _qualified_name_errors(f"{field}.attributes[{name}]", name)
        errors += _attribute_errors(f"{field}.attributes[{name}]", value)
    shared = device.get("allowMultipleAllocations") is True
    for name, value in capacity.items():
        errors += _qualified_name_errors(f"{field}.capacity[{name}]", name)
        errors += _capacity_errors(f"{field}.capacity[{name}]", value, shared)
    if "taints" in device:
        errors += _taint_errors(f"{field}.taints", device["taints"])
    return errors


def _device_count_errors(devices: list[dict[str, Any]]) -> list[str]:
    tainted = any(d.get("taints") for d in devices)
    most = MAX_DEVICES_WITH_TAINTS if tainted else MAX_DEVICES
    if len(devices) > most:
        return [f"spec.devices: Too many: {len(devices)}: must have at most {most} items"]
    return []


def _taint_errors(field: str, taints: Any) -> list[str]:
    if not isinstance(taints, list):
        return [f"{field}: must be a list"]
    errors = []
    if len(taints) > MAX_TAINTS:
        errors.append(f"{field}: Too many: {len(taints)}: must have at most {MAX_TAINTS} items")
    for i, taint in enumerate(taints):
        errors += _one_taint_errors(f"{field}[{i}]", taint if isinstance(taint, dict) else {})
    return errors


def _one_taint_errors(field: str, taint: dict[str, Any]) -> list[str]:
    """key a label name, value a label value, effect one of TAINT_EFFECTS."""
    key, value, effect = taint.get("key"), taint.get("value", ""), taint.get("effect")
    errors = []
    prefix, slash, name = str(key or "").rpartition("/")
    if not key or not _LABEL_NAME.match(name) or (slash and _name_errors(field, prefix, True)):
        errors.append(f"{field}.key: Invalid value {key!r}: must be a label name")
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        errors.append(f"{field}.value: Invalid value {value!r}: must be a label value")
    if effect not in TAINT_EFFECTS:
        errors.append(f"{field}.effect: Unsupported value {effect!r}: supported {TAINT_EFFECTS}")
    return errors


def _qualified_name_errors(field: str, name: str) -> list[str]:
    domain, _, ident = name.rpartition("/")
    errors = _name_errors(field, domain, subdomain=True) if "/" in name else []
    if len(ident) > MAX_ID_LENGTH or not _C_IDENTIFIER.match(ident):
        errors.append(f"{field}: must be a C identifier of at most {MAX_ID_LENGTH} characters")
    return errors


def _attribute_errors(field: str, value: Any) -> list[str]:
    if not isinstance(value, dict):
        return [f"{field}: must be an object"]
    kinds = [k for k in ("int", "bool", "string", "version") if value.get(k) is not None]
    if len(kinds) != 1:
        return [f"{field}: exactly one value must be specified, got {kinds}"]
    text = value.get("string") or value.get("version")
    if isinstance(text, str) and len(text) > MAX_STRING_ATTRIBUTE:
        return [f"{field}: Too long: at most {MAX_STRING_ATTRIBUTE} characters"]
    return []


def _capacity_errors(field: str, value: Any, shared: bool) -> list[str]:
    total = quantity((value or {}).get("value"))
    if total is None:
        return [f"{field}.value: must be a quantity"]
    policy = value.get("requestPolicy")
    if policy is None:
        return []
    if not shared:
        return [f"{field}.requestPolicy: Forbidden: allowMultipleAllocations must be true"]
    if policy.get("validValues") and policy.get("validRange"):
        return [f"{field}.requestPolicy: cannot specify validValues and validRange at once"]
    if policy.get("validRange") is None:
        return []
    return _range_errors(f"{field}.requestPolicy", policy, total)


def _range_errors(field: str, policy: dict[str, Any], total: Fraction) -> list[str]:
    """validRange: min <= default <= max <= the capacity, min + step within the capacity,
    and default and max a whole number of steps above min."""
    bounds = policy["validRange"]
    default, low = quantity(policy.get("default")), quantity(bounds.get("min"))
    if default is None or low is None:
        return [f"{field}: default and validRange.min are required with validRange"]
    errors = []
    if low > total:
        errors.append(f"{field}.validRange.min: larger than the capacity value")
    if default < low:
        errors.append(f"{field}.validRange.min: default is less than min")
    high = quantity(bounds.get("max")) if bounds.get("max") is not None else None
    if high is not None and (low > high or high > total or default > high):
        errors.append(f"{field}.validRange.max: must hold min <= default <= max <= the capacity")
    step = quantity(bounds.get("step")) if bounds.get("step") is not None else None
    if step is not None:
        if low + step > total:
            errors.append(f"{field}.validRange.step: one step above min exceeds the capacity")
        for what, v in (("default", default), ("max", high)):
            if v is not None and (v - low) % step:
                errors.append(f"{field}.validRange.step: {what} is not a whole number of steps")
    return errors
