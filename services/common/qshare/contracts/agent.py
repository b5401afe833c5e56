"""Commands the control plane sends a node agent (`qshare.node.<node>.cmd.<verb>`), their
replies, and the card events the agent publishes (`qshare.evt.gpu.<node>.<gpu>.<kind>`).

The allocator sends a node its whole desired vGPU set with a generation (level-triggered:
a lost or repeated command changes nothing); the agent answers with what it applied and
what it refused, each refusal with its reason.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    model_serializer,
)

from qshare.contracts.claims import MAX_MIB, GpuUuid, Text
from qshare.contracts.domain import Priority
from qshare.contracts.nodes import MAX_CARDS, NodeName
from qshare.contracts.sharing import CardSharing, NodeReason, SharingRefusal, WantedSharing

LOCAL_ID_LIMIT = 0x80000000
"""Driver vGPU ids below this belong to the allocator; the agent keeps the upper half for
vGPUs prepared on the node itself (Kubernetes DRA, device plugin)."""

LocalId = Annotated[StrictInt, Field(ge=1, lt=LOCAL_ID_LIMIT)]


class DesiredVgpu(BaseModel):
    """One vGPU the node should hold."""

    model_config = ConfigDict(extra="forbid")

    local_id: LocalId
    id: uuid.UUID
    claim_id: uuid.UUID
    gpu: GpuUuid
    priority: Priority
    vcore: Annotated[StrictInt, Field(ge=1, le=100)]
    vmemory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MIB)]
    suspended: StrictBool = False
    """The control plane holds it suspended (an open operator record, or a busy card of its
    gang): the agent creates it suspended, and suspends or resumes it when this changes."""

    @model_serializer(mode="wrap")
    def _without_running(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No `suspended` key for a vGPU that runs: an agent of an earlier version refuses
        fields it does not know (the allocator sends the flag only to agents that announce
        APPLY_SUSPENDED_FEATURE)."""
        body: dict[str, Any] = handler(self)
        if not self.suspended:
            body.pop("suspended", None)
        return body


class ApplyDesired(BaseModel):
    """`cmd.apply`: the node's complete desired set; an older generation than the one in force
    is ignored (its reply says so)."""

    model_config = ConfigDict(extra="forbid")

    node: NodeName
    generation: Annotated[StrictInt, Field(ge=0)]
    vgpus: Annotated[list[DesiredVgpu], Field(max_length=4096)]
    sharing: Annotated[list[WantedSharing], Field(max_length=MAX_CARDS)] = []
    """Cards an admin asked to share otherwise than the agent's settings; the others take
    the agent's settings again."""

    @model_serializer(mode="wrap")
    def _without_empty_sharing(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No `sharing` key when nothing is asked, so an agent of an earlier version (which
        refuses fields it does not know) goes on taking applies."""
        body: dict[str, Any] = handler(self)
        if not self.sharing:
            body.pop("sharing", None)
        return body


class Refusal(BaseModel):
    local_id: int
    reason: NodeReason


class ApplyReply(BaseModel):
    """What the node holds after an apply: `applied` are the desired vGPUs present and
    matching, `refused` the ones it could not create (the segment is unchanged for them)."""

    node: NodeName
    generation: int
    applied: list[int]
    refused: list[Refusal] = []
    stale: bool = False
    sharing: list[CardSharing] = []
    """How each card is shared after the apply (an agent of an earlier version sends none)."""
    sharing_refused: list[SharingRefusal] = []


class SuspendCommand(BaseModel):
    """`cmd.suspend` / `cmd.resume`: vGPUs of this node by driver id."""

    model_config = ConfigDict(extra="forbid")

    local_ids: Annotated[list[LocalId], Field(min_length=1, max_length=4096)]
    reason: Annotated[Text, Field(max_length=253)] = ""


class SuspendReply(BaseModel):
    done: list[int]
    missing: list[int] = []


class GpuEvent(BaseModel):
    """Body of `qshare.evt.gpu.<node>.<gpu>.<kind>`: one driver event (the ring's own unit:
    a busy or idle episode, an attach, a death, an OOM, never one message per launch).
    A busy or idle with `seq` 0 and `value` 0 is the card's present state, announced by the
    agent when it starts (on its predecessor's segment, whose events meanwhile were not
    recorded, or on a new one after a reboot), after it registered again, after it
    reconnected to NATS, or when asked on `qshare.nodes.announce`: a consumer treats it as a
    level, not as a new episode."""

    node: str
    gpu: str
    card: int
    kind: str
    vgpu: int | None = None
    pid: int = 0
    value: int = 0
    seq: int
    time_ns: int
    dropped: int = Field(0, description="ring entries lost before the agent read them, so far")


class AnnounceRequest(BaseModel):
    """Body of `qshare.nodes.announce`: every node agent publishes its cards' present busy or
    idle state again (at most once per its rate limit, however many requests arrive)."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[Text, Field(max_length=253)] = ""


class RegisterCommand(BaseModel):
    """`cmd.register`: the allocator got a heartbeat from a node it does not know (deleted
    over REST while its agent ran); the agent registers again, as at its start."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[Text, Field(max_length=253)] = ""
