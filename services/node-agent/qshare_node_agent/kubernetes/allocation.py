"""Reads a ResourceClaim's allocation into what this node must prepare, refusing anything
malformed or meant for another node with an error that names the problem."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from qshare.contracts.domain import HOSTNAME_LABEL, MAX_CORE_SHARE, Priority
from qshare_node_agent.kubernetes.config import DNS_LABEL, DNS_SUBDOMAIN, DNS_SUBDOMAIN_MAX

MIB = 1 << 20
UNSHARED = "whole"  # the share id of a result without a shareID (the device is not shared)
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_UNITS |= {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_NAMESPACE = re.compile(DNS_LABEL)
_UID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?")
NAMESPACE_MAX, UID_MAX = 63, 128


class ClaimError(Exception):
    """This claim cannot be prepared here; the message names what is wrong."""


class VgpuConfig(BaseModel):
    """The opaque parameters of a qshare claim or class (`kind: VgpuConfig`)."""

    model_config = ConfigDict(extra="forbid")

    apiVersion: Literal["qshare.io/v1"] = "qshare.io/v1"
    kind: Literal["VgpuConfig"] = "VgpuConfig"
    priority: Priority = Priority.LOW
    whole: bool = False
    policy: Literal["best-effort", "fixed-share", "burst-share", "be", "fs", "bs"] | None = None


@dataclass(frozen=True)
class DeviceShare:
    """One allocated share of one card, as prepare must make it."""

    request: str
    device: str
    card_index: int
    share_id: str
    cores: int
    memory_mib: int
    config: VgpuConfig

    def key(self, claim_uid: str) -> str:
        return f"dra/{claim_uid}/{self.request}/{self.device}/{self.share_id}"


def check_uid(uid: str) -> None:
    """A claim uid names one claim's vGPU keys (`dra/<uid>/...`) and CDI spec file as it
    is: refuse one that could name another's (a '/', or characters a file name drops)."""
    if len(uid) > UID_MAX or not _UID.fullmatch(uid):
        raise ClaimError(f"claim uid {uid!r} is not a valid Kubernetes uid (letters, digits and "
                         f"'-', at most {UID_MAX})")  # fmt: skip


def check_reference(namespace: str, name: str, uid: str) -> None:
    """Refuse a claim reference no ResourceClaim carries before it goes into an API path."""
    if len(namespace) > NAMESPACE_MAX or not _NAMESPACE.fullmatch(namespace):
        raise ClaimError(f"namespace {namespace!r} is not a valid Kubernetes namespace")
    if len(name) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(name):
        raise ClaimError(f"name {name!r} is not a valid ResourceClaim name")
    check_uid(uid)


def quantity_bytes(value: object, what: str) -> int:
    """A Kubernetes quantity (`2Gi`, `1073741824`, `50`) as a whole number."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ClaimError(f"{what} {value!r} is not a quantity")
    number, unit = float(match.group(1)), match.group(2)
    total = number * _UNITS[unit] if unit else number
    if total != int(total):
        raise ClaimError(f"{what} {value!r} is not a whole number")
    return int(total)


def card_of(device: str, cards: Mapping[int, int]) -> int:
    """The card index of device `gpu-<index>` on this node; `cards` maps index -> MiB."""
    match = re.fullmatch(r"gpu-([0-9]+)", device)
    if match is None or int(match.group(1)) not in cards:
        names = ", ".join(f"gpu-{i}" for i in sorted(cards))
        raise ClaimError(f"device {device!r} is not on this node (devices: {names})")
    return int(match.group(1))


def shares(
    claim: dict[str, Any],
    uid: str,
    driver: str,
    node: str,
    cards: Mapping[int, int],
    min_mib: int,
) -> list[DeviceShare]:
    """The shares of this driver in `claim`, checked against this node's cards."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimError(f"the API holds claim uid {meta.get('uid')!r}, the kubelet asked {uid!r}")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("the claim is not allocated")
    _check_node(allocation.get("nodeSelector"), node)
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == driver]
    if not results:
        raise ClaimError(f"the claim has no device of driver {driver}")
    return [_share(r, devices.get("config") or [], driver, node, cards, min_mib) for r in results]


def _check_node(selector: dict[str, Any] | None, node: str) -> None:
    """The allocation must select this node (by metadata.name or the hostname label)."""
    if selector is None:
        return
    for term in selector.get("nodeSelectorTerms") or []:
        for req in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            if req.get("key") in ("metadata.name", HOSTNAME_LABEL):
                if req.get("operator") == "In" and node in (req.get("values") or []):
                    return
                raise ClaimError(f"the claim is allocated to node {req.get('values')}, not {node}")
    raise ClaimError(f"the claim's node selector does not select node {node}")


def _share(
    result: dict[str, Any],
    configs: list[dict[str, Any]],
    driver: str,
    node: str,
    cards: Mapping[int, int],
    min_mib: int,
) -> DeviceShare:
    request, device = str(result.get("request")), str(result.get("device"))
    if result.get("pool") != node:
        raise ClaimError(f"device {device} is in pool {result.get('pool')!r}, not {node!r}")
    index = card_of(device, cards)
    config = _config(configs, request, driver)
    consumed = result.get("consumedCapacity") or {}
    cores = quantity_bytes(consumed.get("cores", MAX_CORE_SHARE), "cores")
    memory_mib = _memory_mib(consumed.get("memory"), cards[index], config.whole)
    if not 1 <= cores <= MAX_CORE_SHARE:
        raise ClaimError(f"cores must be 1-{MAX_CORE_SHARE}, got {cores}")
    if config.whole and cores != MAX_CORE_SHARE:
        raise ClaimError(f"a whole card needs cores {MAX_CORE_SHARE}, got {cores}")
    if not min_mib <= memory_mib <= cards[index]:
        raise ClaimError(f"memory must be {min_mib}-{cards[index]} MiB, got {memory_mib} MiB")
    share_id = str(result.get("shareID") or UNSHARED)
    return DeviceShare(request, device, index, share_id, cores, memory_mib, config)


def _memory_mib(value: object, card_mib: int, whole: bool) -> int:
    if whole or value is None:
        return card_mib
    size = quantity_bytes(value, "memory")
    if size % MIB:
        raise ClaimError(f"memory {value!r} is not a whole number of MiB")
    return size // MIB


def _config(configs: list[dict[str, Any]], request: str, driver: str) -> VgpuConfig:
    """Class configs first, then the claim's: a later one overrides an earlier one."""
    merged: dict[str, Any] = {}
    ordered = sorted(configs, key=lambda c: c.get("source") != "FromClass")
    for entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver or not _targets(entry.get("requests"), request):
            continue
        params = opaque.get("parameters")
        if not isinstance(params, dict):
            raise ClaimError(f"opaque config of request {request!r} is not a JSON object")
        merged |= params
    try:
        return VgpuConfig.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "parameters"
        raise ClaimError(f"opaque config of request {request!r}: {where}: {err['msg']}") from None


def _targets(named: list[str] | None, request: str) -> bool:
    """Whether a config naming requests `named` (none: every request) applies to the result
    of `request`: its own name, or for a subrequest (`<request>/<subrequest>`, allocated from
    a prioritized list) its main request's, which names all of its subrequests."""
    return not named or request in named or request.partition("/")[0] in named
