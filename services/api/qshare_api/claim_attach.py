"""What `qshare run --claim ID` needs from the API: the claim's vGPUs on this node, checked
(ready, placed on this node; every card, or the one chosen), as the launcher's arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qshare.contracts.nodes import default_node_name
from qshare_api.client import Client


class AttachError(Exception):
    """The claim cannot be run here; the message says why and what to do."""


@dataclass(frozen=True)
class Attachment:
    vgpu: int
    segment: str
    shm_dir: Path | None
    gpu_uuid: str


def this_node() -> str:
    """The node name the local agent uses by default: $QSHARE_NODE_NAME or the host name."""
    return os.environ.get("QSHARE_NODE_NAME") or default_node_name()


def resolve(client: Client, claim_id: str, node: str, card: int | None) -> list[Attachment]:
    """The claim's vGPUs to run in: card `card`'s alone, else all of them (card order)."""
    claim = client.get(f"/v1/claims/{claim_id}")
    _check_runnable(claim, node)
    return [_attachment(claim, vgpu) for vgpu in _pick(claim, card)]


def _check_runnable(claim: dict[str, Any], node: str) -> None:
    status = claim["status"]
    if status != "ready":
        why = f" ({claim['reason']})" if claim.get("reason") else ""
        raise AttachError(f"claim {claim['id']} is {status}{why}; it can run once it is ready")
    if claim.get("node") != node:
        raise AttachError(
            f"claim {claim['id']} runs on node {claim.get('node')}, and this is node {node}: "
            "run the command there (or set QSHARE_NODE_NAME if this node has another name)"
        )


def _pick(claim: dict[str, Any], card: int | None) -> list[dict[str, Any]]:
    vgpus: list[dict[str, Any]] = sorted(claim["vgpus"], key=lambda v: int(v["index"]))
    if card is None:
        return vgpus
    for vgpu in vgpus:
        if vgpu["index"] == card:
            return [vgpu]
    indexes = ", ".join(str(v["index"]) for v in vgpus)
    raise AttachError(f"claim {claim['id']} holds no card {card}; its cards: {indexes}")


def _attachment(claim: dict[str, Any], vgpu: dict[str, Any]) -> Attachment:
    if vgpu.get("local_id") is None or not vgpu.get("segment"):
        raise AttachError(f"claim {claim['id']}: its node has not reported a driver segment")
    shm_dir = Path(vgpu["shm_dir"]) if vgpu.get("shm_dir") else None
    return Attachment(vgpu["local_id"], vgpu["segment"], shm_dir, vgpu["gpu"])
