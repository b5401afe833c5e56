"""How a card is shared: as its node agent reports it (`CardSharing`, with each heartbeat and
apply), and as an admin asks for it over REST (`SharingSettings`), which the allocator keeps
and sends the node with its desired state, so that it outlives agent restarts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)

from qshare.contracts.claims import GpuUuid, Text
from qshare.contracts.domain import CardPolicy
from qshare.contracts.errors import InvalidInput

Timeslice = Literal["driver", "default", "short", "medium", "long"]
"""A card's compute timeslice between processes: nvidia-smi's levels, or `driver` for
whatever the driver has (the node agent set nothing)."""
AskedTimeslice = Literal["default", "short", "medium", "long"]
"""A timeslice an admin may ask of a card over REST: one of nvidia-smi's levels."""
REASON_MAX = 1000
"""Characters of a reason a node gives (the agent cuts longer ones)."""


def _readable(reason: str) -> str:
    return reason.replace("\x00", "\ufffd")[:REASON_MAX]


NodeReason = Annotated[StrictStr, AfterValidator(_readable)]
"""Free text a node agent reports for people (why it refused a vGPU, a sharing, a timeslice):
a NUL, which Postgres text cannot hold, is written U+FFFD, and it is cut at REASON_MAX
characters, so that a reason never costs the report that carries it (a heartbeat refused for
its reason text would time its node out)."""


class CardSharing(BaseModel):
    """How a card is shared now, as its node agent reports it with each heartbeat. Fields this
    version does not know are dropped, not refused: an agent upgraded before its control
    plane may report more, and its heartbeats must still count (docs/cluster.md, upgrades)."""

    model_config = ConfigDict(extra="ignore")

    gpu: Text
    policy: CardPolicy = Field(description="sharing among the card's low-priority vGPUs")
    release_mode: Literal["fixed", "auto"] = Field(
        description="fixed: the release delay set; auto: the driver chooses it (docs/colocation.md)"
    )
    release_delay_s: float = Field(
        ge=0, le=60, description="the release delay in force (in auto mode, the one chosen now)"
    )
    release_auto_bound_s: float | None = Field(
        None, gt=0, le=1, description="auto mode: what it may add to high priority's p99"
    )
    lp_window_s: float = Field(
        ge=0, le=1, description="low priority's work in flight per process beside high priority"
    )
    lp_device_gate: StrictBool = Field(
        False, description="low priority's queued work waits on the card's gate on the GPU"
    )
    timeslice: Timeslice | None = Field(
        None,
        description="the compute timeslice the node agent set on the card (at its start, or as "
        "asked over REST); driver: it set none (the driver's own is in force); null: not "
        "reported (an agent of an earlier version)",
    )
    timeslice_refused: NodeReason | None = Field(
        None, description="the timeslice the agent was asked for and why the card did not take it"
    )


class SharingSettings(BaseModel):
    """How a card is to be shared (`PATCH /v1/gpus/{uuid}/sharing`, admins). Each field left
    out keeps what was asked before, or else the node agent's own setting."""

    model_config = ConfigDict(extra="forbid")

    policy: CardPolicy | None = Field(None, description="among the card's low-priority vGPUs")
    release_mode: Literal["fixed", "auto"] | None = Field(
        None, description="fixed: release_delay_s; auto: chosen up to it (needs the bound)"
    )
    release_delay_s: float | None = Field(
        None, ge=0, le=60, description="release delay; in auto mode, the longest it chooses"
    )
    release_auto_bound_s: float | None = Field(
        None, gt=0, le=1, description="auto mode: what it may add to high priority's p99"
    )
    lp_window_s: float | None = Field(
        None, ge=1e-6, le=1.0, description="low priority's work in flight beside high priority"
    )
    lp_device_gate: StrictBool | None = Field(
        None, description="low priority's queued work waits on the card's gate on the GPU"
    )
    timeslice: AskedTimeslice | None = Field(
        None, description="the card's compute timeslice between processes, set by the node "
        "agent with nvidia-smi (real cards, agent as root); withdrawn, the card takes the "
        "agent's QSHARE_NODE_TIMESLICE again, or nvidia-smi's default where that is driver",
    )  # fmt: skip

    @model_validator(mode="after")
    def _names_something(self) -> SharingSettings:
        if all(getattr(self, name) is None for name in SharingSettings.model_fields):
            raise ValueError("name at least one of " + ", ".join(SharingSettings.model_fields))
        return self

    def over(self, before: SharingSettings | None) -> SharingSettings:
        """This change on top of what was asked before: what it names wins, `fixed` drops
        the bound; the result is checked whole (InvalidInput naming the field)."""
        merged: dict[str, Any] = {} if before is None else before.model_dump(exclude_none=True)
        if self.release_mode == "fixed":
            merged.pop("release_auto_bound_s", None)
        merged |= self.model_dump(exclude_none=True)
        result = SharingSettings.model_validate(merged)
        result._check_release()
        return result

    def _check_release(self) -> None:
        if self.release_auto_bound_s is not None and self.release_mode != "auto":
            raise InvalidInput.on(
                "release_auto_bound_s", "goes with release_mode auto (asked now or before)"
            )
        if self.release_mode == "auto" and self.release_auto_bound_s is None:
            raise InvalidInput.on("release_auto_bound_s", "needed to turn auto release on")
        if self.release_mode == "auto" and self.release_delay_s == 0:
            raise InvalidInput.on(
                "release_delay_s", "auto release needs a release delay above 0 (its longest)"
            )


class WantedSharing(BaseModel):
    """One card's asked sharing in a node's desired state (`cmd.apply`)."""

    model_config = ConfigDict(extra="forbid")

    gpu: GpuUuid
    settings: SharingSettings


class SharingRefusal(BaseModel):
    """A card whose asked sharing the node agent could not give it, and why."""

    gpu: GpuUuid
    reason: NodeReason


class ChangeSharing(BaseModel):
    """Request on `qshare.allocator.gpus.sharing`: ask for a card's sharing (`change` on top
    of what was asked before), or with `change` null go back to its node agent's settings."""

    uuid: GpuUuid
    change: SharingSettings | None
