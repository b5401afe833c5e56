"""This node's cards as one ResourceSlice of driver `qshare.io`: a shareable device per card
with capacities `memory` and `cores` and its attributes. Every capacity's request policy
holds the API server's rules (min <= default <= max <= value, and min + step <= value when a
step is given): a card with less memory than the smallest claim is left out, since the
server would refuse the whole slice for it. An unhealthy card's device carries the taint
`qshare.io/unhealthy` (resource.k8s.io/v1 `Device.taints`), dated when it was first seen so."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from qshare.contracts.domain import MAX_CORE_SHARE
from qshare_node_agent.kubernetes.backend import CardInfo

DEFAULT_CORES = 10
UNHEALTHY_TAINT = "qshare.io/unhealthy"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time as the API server writes it


class UnhealthySince:
    """When each card was first seen unhealthy in the current run of ill health: its taint's
    `timeAdded`, kept across republishes (the API server would date a taint sent without
    one anew on every update, restarting the clock of a NoExecute toleration)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}

    def adopt(self, published: Mapping[str, Any]) -> None:
        """Take the dates of the unhealthy taints on `published` (the slice an earlier run
        of the agent left), by card UUID: a restarted agent keeps a sick card's first date
        rather than restarting a NoExecute toleration's clock. Dates it cannot read are
        skipped (the card is dated now)."""
        spec = published.get("spec")
        for body in spec.get("devices") or [] if isinstance(spec, dict) else []:
            uuid, stamp = _card_uuid(body), _taint_date(body)
            if uuid is not None and stamp is not None:
                self._since.setdefault(uuid, stamp)

    def update(self, cards: list[CardInfo]) -> dict[int, float]:
        """The unhealthy cards' times by index; a healed card's time is forgotten."""
        now = self._clock()
        self._since = {c.uuid: self._since.get(c.uuid, now) for c in cards if not c.healthy}
        return {c.index: self._since[c.uuid] for c in cards if not c.healthy}


def unhealthy_taint(effect: str, since: float) -> dict[str, str]:
    stamp = datetime.fromtimestamp(int(since), UTC).strftime(TIME_FORMAT)
    return {"key": UNHEALTHY_TAINT, "effect": effect, "timeAdded": stamp}


def _card_uuid(device: Any) -> str | None:
    """The `uuid` attribute of a published device; None where it has none."""
    attrs = device.get("attributes") if isinstance(device, dict) else None
    uuid = attrs.get("uuid") if isinstance(attrs, dict) else None
    value = uuid.get("string") if isinstance(uuid, dict) else None
    return value if isinstance(value, str) else None


def _taint_date(device: Any) -> float | None:
    """The `timeAdded` of a published device's unhealthy taint, as seconds; None without
    one, or one that cannot be read."""
    taints = device.get("taints") if isinstance(device, dict) else None
    for taint in taints if isinstance(taints, list) else []:
        if isinstance(taint, dict) and taint.get("key") == UNHEALTHY_TAINT:
            try:
                return (
                    datetime.strptime(str(taint.get("timeAdded")), TIME_FORMAT)
                    .replace(tzinfo=UTC)
                    .timestamp()
                )
            except ValueError:
                return None
    return None


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver.replace('.', '-')}"


def device(card: CardInfo, min_mib: int, taint: dict[str, str] | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "uuid": {"string": card.uuid},
        "model": {"string": card.model},
        "index": {"int": card.index},
        "policy": {"string": card.policy},
        "healthy": {"bool": card.healthy},
    }
    if card.numa_node is not None:
        attrs["numaNode"] = {"int": card.numa_node}
    body: dict[str, Any] = {
        "name": f"gpu-{card.index}",
        "allowMultipleAllocations": True,
        "attributes": attrs,
        "capacity": _capacity(card, min_mib),
    }
    if taint is not None:
        body["taints"] = [taint]
    return body


def _capacity(card: CardInfo, min_mib: int) -> dict[str, Any]:
    return {
        "memory": {
            "value": f"{card.memory_mib}Mi",
            "requestPolicy": {
                "default": f"{min_mib}Mi",
                "validRange": _memory_range(card, min_mib),
            },
        },
        "cores": {
            "value": str(MAX_CORE_SHARE),
            "requestPolicy": {
                "default": str(DEFAULT_CORES),
                "validRange": {"min": "1", "max": str(MAX_CORE_SHARE), "step": "1"},
            },
        },
    }


def _memory_range(card: CardInfo, min_mib: int) -> dict[str, str]:
    """From the smallest claim to the whole card in MiB steps; no step on a card that holds
    only the smallest claim (one step above it would exceed the card)."""
    bounds = {"min": f"{min_mib}Mi", "max": f"{card.memory_mib}Mi"}
    if card.memory_mib > min_mib:
        bounds["step"] = "1Mi"
    return bounds


def resource_slice(
    node: str,
    driver: str,
    cards: list[CardInfo],
    min_mib: int,
    generation: int,
    taints: Mapping[int, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The slice, `taints` by card index; the DeviceClasses select only `healthy` cards too
    (a cluster without device taints drops the field), so nothing new lands on a card that
    turned unhealthy while what it already runs stays visible."""
    taints = taints or {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                device(c, min_mib, taints.get(c.index)) for c in cards if c.memory_mib >= min_mib
            ],
        },
    }
