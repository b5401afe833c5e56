"""Device-time usage a node agent reports (`qshare.node.<node>.usage`, every
`usage_interval_s`) and the starvation records and moves the preemptor derives from it.

Per card, `hp_ns` is the device time high-priority vGPUs used in the interval: time low
priority could not harvest. Per vGPU, `device_ns` is what it used in the interval. Both are
read from the driver's counters; a vGPU first seen in this interval is reported from the next.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from qshare.contracts.agent import LocalId
from qshare.contracts.claims import GpuUuid
from qshare.contracts.nodes import NodeName

MAX_INTERVAL_NS = 3600 * 10**9
Nanoseconds = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class VgpuUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    local_id: LocalId
    device_ns: Nanoseconds


class CardUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: GpuUuid
    hp_ns: Nanoseconds = Field(description="device time high priority used: not harvestable")
    vgpus: Annotated[list[VgpuUsage], Field(max_length=4096)] = []


class NodeUsage(BaseModel):
    """One interval of one node; the node must be the one the subject names."""

    model_config = ConfigDict(extra="forbid")

    node: NodeName
    interval_ns: Annotated[StrictInt, Field(gt=0, le=MAX_INTERVAL_NS)]
    cards: Annotated[list[CardUsage], Field(max_length=64)]


class MoveClaim(BaseModel):
    """`qshare.allocator.claims.move`: move a starved low-priority single-card claim off
    `from_gpu` to the first of `to_gpus` (best first) where it fits."""

    model_config = ConfigDict(extra="forbid")

    claim_id: uuid.UUID
    from_gpu: GpuUuid
    to_gpus: Annotated[list[GpuUuid], Field(min_length=1, max_length=64)]
    reason: Annotated[str, Field(max_length=253)] = "starved"


class MoveReply(BaseModel):
    claim_id: uuid.UUID
    moved_to: str | None = Field(None, description="the card it now holds; None: not moved")
    from_node: str | None = None
    to_node: str | None = None
    reason: str = ""


class Starved(BaseModel):
    """Body of `qshare.evt.claim.<id>.starved`."""

    claim_id: uuid.UUID
    gpu: str
    node: str
    share: float = Field(description="the claim's device time over the window, per window")
    harvestable_share: float = Field(description="the card's time HP left, per window")
    window_s: float
