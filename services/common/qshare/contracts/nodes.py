"""Node messages: registration with cards, heartbeats, and the inventory views."""

from __future__ import annotations

import re
import socket
import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from qshare.contracts.claims import WHOLE, GpuUuid, Labels, MemoryMiB, Text
from qshare.contracts.domain import NodeStatus
from qshare.contracts.sharing import CardSharing, SharingSettings

MAX_CARDS = 64
MAX_GENERATION = 2**63 - 1  # nodes.applied_generation is a BIGINT
"""Cards one node may report; a heartbeat lists at most this many unhealthy ones."""
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9_]*[A-Za-z0-9])?"
NODE_NAME_PATTERN = rf"^{_LABEL}(\.{_LABEL})*$"
NODE_NAME_MAX = 253
NodeName = Annotated[str, Field(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)]
"""Labels of letters, digits, `-` and `_` joined by dots: a Kubernetes node name (a DNS
subdomain, e.g. `ip-10-0-0-1.ec2.internal`) fits. In subjects each dot is written `~`."""


def is_node_name(value: str) -> bool:
    """Whether `value` is a node name (NodeName's rule, for names that come another way: a
    subject's token, a flag)."""
    return 0 < len(value) <= NODE_NAME_MAX and re.fullmatch(NODE_NAME_PATTERN, value) is not None


def default_node_name() -> str:
    """This host's node name when none is configured: the host name as a subject token."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:63].strip("-_") or "node"


SEGMENT_NAME_MAX = 47
"""The driver's limit on a segment name (QS_NAME_MAX less its NUL)."""
SEGMENT_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
"""What the driver takes as a segment name (it names files in the segment directory): no
'/', not starting with '.'."""
SegmentName = Annotated[
    str, Field(min_length=1, max_length=SEGMENT_NAME_MAX, pattern=SEGMENT_NAME_PATTERN)
]
"""A driver segment name."""


class GpuSpec(BaseModel):
    """A physical card as the node agent discovered it."""

    model_config = ConfigDict(extra="forbid")

    uuid: GpuUuid
    index: Annotated[int, Field(ge=0, le=255), WHOLE]
    model: Annotated[Text, Field(min_length=1, max_length=128)]
    memory: MemoryMiB = Field(description="card memory: integer MiB or e.g. '80Gi'")
    healthy: bool = True


class NodeRegistration(BaseModel):
    """Request on `qshare.allocator.nodes.register`; re-registering replaces labels and cards."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "gpu-node-1",
                    "labels": {"zone": "a", "qshare.io/policy": "burst-share"},
                    "gpus": [{"uuid": "GPU-1a2b", "index": 0, "model": "A100", "memory": "80Gi"}],
                }
            ]
        },
    )

    name: NodeName
    labels: Labels = Field(default_factory=dict)
    gpus: Annotated[list[GpuSpec], Field(min_length=1, max_length=MAX_CARDS)]
    segment: SegmentName | None = Field(None, description="the node agent's driver segment")
    shm_dir: Annotated[str, Field(max_length=255, pattern=r"^/[^\x00]*$")] | None = Field(
        None, description="directory of the segment (None: the driver's default)"
    )
    applied_generation: Annotated[int, Field(ge=-1, le=MAX_GENERATION), WHOLE] = Field(
        -1,
        description="the latest desired generation this agent applied since it started (-1: "
        "none yet, a starting agent); a running agent registering again (its labels changed) "
        "keeps what the allocator confirmed of it, never more",
    )

    @field_validator("gpus")
    @classmethod
    def _distinct_cards(cls, gpus: list[GpuSpec]) -> list[GpuSpec]:
        """Checked on the field, so the error names `gpus`."""
        if len({g.uuid for g in gpus}) != len(gpus):
            raise ValueError("card UUIDs must be distinct")
        if len({g.index for g in gpus}) != len(gpus):
            raise ValueError("card indexes must be distinct")
        return gpus


class Heartbeat(BaseModel):
    """Event on `qshare.node.<node>.heartbeat`; every card not listed unhealthy is healthy.
    `sharing` reports how each card is shared (an agent of an earlier version sends none)."""

    unhealthy: Annotated[list[Text], Field(max_length=MAX_CARDS)] = []
    sharing: Annotated[list[CardSharing], Field(max_length=MAX_CARDS)] = []


class RemoveNode(BaseModel):
    """Request on `qshare.allocator.nodes.delete`: forget a node and its cards."""

    name: NodeName


class NodeChange(BaseModel):
    """`PATCH /v1/nodes/{name}` (admins): `schedulable: false` cordons the node (nothing new
    is placed there; what runs keeps running), `true` opens it again."""

    model_config = ConfigDict(extra="forbid")

    schedulable: StrictBool


class ChangeNode(BaseModel):
    """Request on `qshare.allocator.nodes.update`."""

    name: NodeName
    change: NodeChange


class RemoveCard(BaseModel):
    """Request on `qshare.allocator.gpus.delete`: forget one card of a node."""

    node: NodeName
    uuid: GpuUuid


class RemovalReply(BaseModel):
    """The claims that held vGPUs on what was removed: each is now `failed`."""

    failed_claims: list[uuid.UUID] = []


class GpuView(BaseModel):
    """A card with its allocated and free capacity."""

    uuid: str
    node: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = Field(description="what the node's heartbeats say")
    retired: bool = Field(
        False, description="the node no longer reports it; never placed on until it does"
    )
    max_vgpus: int
    vgpus: int
    allocated_mib: int
    free_mib: int
    core_high_used: int
    core_low_used: int
    core_high_free: int
    core_low_free: int
    sharing: CardSharing | None = Field(
        None, description="how the card is shared, as its node last reported; null until then"
    )
    sharing_requested: SharingSettings | None = Field(
        None, description="what an admin asked for (PATCH …/sharing); null: the node's settings"
    )
    sharing_pending: bool = Field(
        False, description="the node has not yet applied what was asked (or its withdrawal)"
    )
    sharing_refused: str | None = Field(
        None, description="why the node could not share the card as asked, when it could not"
    )


class NodeView(BaseModel):
    """A node, its readiness and its capacity summed over its cards."""

    name: str
    status: NodeStatus
    labels: dict[str, str]
    schedulable: bool
    heartbeat_at: datetime
    gpus: int
    memory_mib: int
    free_mib: int
