"""Placement preview: where a claim would fit now, per candidate node, without placing it
(`qshare.allocator.placement.preview`; the scheduler extender's filter and prioritize)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from qshare.contracts.claims import ClaimSpec, Text

MAX_SCORE = 10
"""The scheduler's highest extender score (MaxExtenderPriority)."""


class PreviewPlacement(BaseModel):
    """Request: would `spec` fit on each of `nodes` (allocator node names)?"""

    spec: ClaimSpec
    nodes: Annotated[list[Text], Field(max_length=10000)]
    """Node names as the scheduler sent them (no NUL: they go to Postgres as text)."""


class PlacementPreview(BaseModel):
    """`scores` holds every node that fits (0..MAX_SCORE, higher is better under the
    cluster's node policy); `failed` every other node with the reason."""

    scores: dict[str, int] = {}
    failed: dict[str, str] = {}
