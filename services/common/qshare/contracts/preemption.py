"""Requests the preemptor answers (`qshare.preemptor.claims.suspend|resume`) and its replies."""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field

from qshare.contracts.claims import Text


class ClaimAction(BaseModel):
    """Suspend or resume one claim on every card it holds; `tenant` None means an admin acts."""

    model_config = ConfigDict(extra="forbid")

    claim_id: uuid.UUID
    tenant: str | None = None
    reason: Text = "operator"
    """Carried to the node agents' commands and the events: no NUL, at most 253 characters."""
    actor: Text | None = None
    """Who acts, as the API names the caller's token ("<name> (token <id>)"): recorded as an
    operator record's `suspended_by` or `resumed_by`. Set by the API, never by the caller."""


class ClaimActionReply(BaseModel):
    claim_id: uuid.UUID
    suspended: bool
    vgpus: int = Field(description="vGPUs the nodes acted on")
    missing: int = Field(0, description="vGPUs a node did not have or did not answer for")


class ClaimRef(BaseModel):
    """Body of the preemptor's `qshare.evt.claim.<id>.suspended|resumed` events."""

    claim_id: uuid.UUID
