"""Claim messages: what a tenant asks for, what the allocator answers, what claim events carry."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    WithJsonSchema,
    model_validator,
)

from qshare.contracts.domain import ClaimStatus, PlacementPolicy, Priority
from qshare.contracts.quantities import format_mib, parse_mib

MAX_MIB = 16 * 1024 * 1024
"""16 TiB: far above any card, and inside the 32-bit columns that store MiB."""


def _whole(value: Any) -> Any:
    """JSON Schema's `integer` admits `178.0`; so do we. `12.5`, `"12"` and `true` stay errors."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if value is None:
        return None  # an optional field's type says whether None is allowed
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


WHOLE = BeforeValidator(_whole)
"""Put after the `Field(...)` of an int (so its bounds reach the JSON schema): an integer,
written `178` or `178.0` (what JSON Schema calls an integer)."""


def _memory(value: Any) -> int:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("must be an integer number of MiB or a quantity such as '4Gi'")
    mib = parse_mib(value)
    if mib > MAX_MIB:
        raise ValueError(f"must be at most {format_mib(MAX_MIB)}")
    return mib


MEMORY_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_MIB, "description": "MiB"},
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"},
    ],
    "examples": [4096, "4Gi", "512Mi"],
}
"""What a memory field accepts, as its whole schema: extending `int`'s would keep a
`type: integer` beside the anyOf, which refuses every quantity (`'4Gi'`) in JSON Schema."""

MemoryMiB = Annotated[
    int, BeforeValidator(_memory), WithJsonSchema(MEMORY_SCHEMA, mode="validation")
]
"""Integer MiB or a Kubernetes quantity, always stored as whole MiB."""

Text = Annotated[StrictStr, Field(max_length=253, pattern=r"^[^\x00]*$")]
"""A short string Postgres can store (no NUL characters)."""
GPU_UUID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
GpuUuid = Annotated[str, Field(min_length=1, max_length=128, pattern=GPU_UUID_PATTERN)]
"""A card's UUID as NVML gives it (`GPU-…`), or a simulated card's."""
MAX_LABELS = 32
LabelKey = Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=r"^[^\x00]*$")]
LabelValue = Annotated[StrictStr, Field(max_length=63, pattern=r"^[^\x00]*$")]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]
"""Node labels and selectors, bounded like Kubernetes labels: at most 32 pairs, keys up to
253 characters, values up to 63, so no claim, reply or event can grow past a few KiB."""
ClassName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


GangName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
]


class PlacementOverride(BaseModel):
    """Per-claim override of the cluster's placement policy, at node and at card level."""

    model_config = ConfigDict(extra="forbid")

    node: PlacementPolicy | None = None
    card: PlacementPolicy | None = None


class ClaimSpec(BaseModel):
    """A request for `count` vGPUs on distinct cards of one node, each `vcore` and `vmemory`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "priority": "high",
                    "vcore": 30,
                    "vmemory": "4Gi",
                    "count": 1,
                    "class_name": "qshare",
                    "node_selector": {"zone": "a"},
                    "placement": {"node": "binpack", "card": "spread"},
                    "idempotency_key": "train-job-42",
                }
            ]
        },
    )

    priority: Priority = Field(description="`high` (online, preempts) or `low` (offline, yields)")
    vcore: Annotated[int, Field(ge=1, le=100, description="core share per card, percent"), WHOLE]
    vmemory: MemoryMiB = Field(description="memory per card: integer MiB or e.g. '4Gi'")
    count: Annotated[int, Field(ge=1, le=64, description="distinct cards on one node"), WHOLE] = 1
    class_name: ClassName = Field(default="qshare", description="how vGPUs are produced")
    node_selector: Labels = Field(default_factory=dict, description="labels a node must carry")
    placement: PlacementOverride | None = None
    idempotency_key: Annotated[Text, Field(min_length=1, max_length=128)] | None = None
    gang: GangName | None = Field(
        None, description="claims of one gang are suspended and resumed together"
    )


class CreateClaim(BaseModel):
    """Command on `qshare.allocator.claims.create`."""

    tenant: Annotated[Text, Field(min_length=1, max_length=128)]
    spec: ClaimSpec


class DeleteClaim(BaseModel):
    """Command on `qshare.allocator.claims.delete`; `tenant` None means an admin acts."""

    claim_id: uuid.UUID
    tenant: str | None = None


class ClaimResize(BaseModel):
    """`PATCH /v1/claims/{id}`: a claim's new size per card; a field left out keeps its value.

    A placed or ready claim is resized on the cards it holds, or not at all; a pending one
    only changes what it waits for."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"vcore": 50, "vmemory": "8Gi"}], "minProperties": 1},
    )

    vcore: (
        Annotated[int, Field(ge=1, le=100, description="core share per card, percent"), WHOLE]
        | None
    ) = None
    vmemory: MemoryMiB | None = Field(None, description="memory per card: MiB or e.g. '8Gi'")

    @model_validator(mode="after")
    def _changes_something(self) -> ClaimResize:
        if self.vcore is None and self.vmemory is None:
            raise ValueError("give vcore, vmemory or both")
        return self


class ResizeClaim(BaseModel):
    """Command on `qshare.allocator.claims.resize`; `tenant` None means an admin acts."""

    claim_id: uuid.UUID
    tenant: str | None = None
    change: ClaimResize


class VgpuView(BaseModel):
    """One slice of one card, as placed."""

    id: uuid.UUID
    node: str
    gpu: str
    index: int
    vcore: int
    vmemory_mib: int
    priority: Priority
    local_id: int | None = Field(None, description="the vGPU's id in the node's driver segment")
    segment: str | None = Field(None, description="the node's driver segment")
    shm_dir: str | None = Field(None, description="directory of the segment")


class ClaimSuspension(BaseModel):
    """Why a placed or ready claim's vGPUs are held stopped now: its open preemption record
    (`GET /v1/preemptions?claim=`), an operator's before a gang's where it has both."""

    kind: Literal["operator", "gang"] = Field(
        description="operator: `POST /v1/claims/{id}/suspend`, until resumed; gang: high "
        "priority busy on a card of its gang, until none is"
    )
    since: datetime
    reason: str
    by: str | None = Field(
        None, description="operator: the token that suspended it, as '<token name> (token "
        "<id>)'; null for gang"
    )  # fmt: skip
    cards: list[str] | None = Field(
        None, description="gang: the busy cards holding it; null for operator"
    )
    preemption: int = Field(description="the record's id in `GET /v1/preemptions`")


class ClaimView(BaseModel):
    """A claim as stored: its request, its status and, once placed, its vGPUs."""

    id: uuid.UUID
    tenant: str
    status: ClaimStatus
    priority: Priority
    vcore: int
    vmemory_mib: int
    count: int
    class_name: str
    node_selector: dict[str, str]
    placement: PlacementOverride | None = None
    idempotency_key: str | None = None
    reason: str | None = None
    node: str | None = None
    vgpus: list[VgpuView] = []
    gang: str | None = None
    evict_at: datetime | None = Field(None, description="set while the claim is being evicted")
    suspended: ClaimSuspension | None = Field(
        None, description="set while the control plane holds the claim's vGPUs suspended"
    )
    created_at: datetime
    updated_at: datetime


class CreateClaimReply(BaseModel):
    """`created` is False when the idempotency key named an existing claim."""

    claim: ClaimView
    created: bool
