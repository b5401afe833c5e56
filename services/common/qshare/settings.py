"""Settings shared by the control-plane services (env prefix `QSHARE_`), read when built."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.contracts.domain import CardPolicy, PlacementPolicy

log = logging.getLogger(__name__)


class ClusterSettings(BaseSettings):
    """Cluster-wide rules that the allocator enforces and the api reports.

    Granularity follows the qGPU seed: at least 1 GiB per vGPU, at most
    floor(card GiB / 4) vGPUs per card.
    """

    model_config = SettingsConfigDict(
        env_prefix="QSHARE_", extra="ignore", populate_by_name=True
    )  # an alias is read as it stands: only QSHARE_ names, never a bare NODE_POLICY

    node_timeout_s: float = Field(30.0, gt=0, description="no heartbeat for this long: NotReady")
    min_vgpu_mib: int = Field(1024, ge=1, description="smallest vGPU memory")
    gib_per_vgpu: int = Field(4, ge=1, description="at most floor(card GiB / this) vGPUs per card")
    node_policy: PlacementPolicy = Field(
        PlacementPolicy.SPREAD,
        validation_alias=AliasChoices("QSHARE_PLACEMENT_NODE", "QSHARE_NODE_POLICY"),
        description="claims' default node placement (QSHARE_PLACEMENT_NODE; the older "
        "QSHARE_NODE_POLICY is read when it holds a placement policy)",
    )
    card_policy: PlacementPolicy = Field(
        PlacementPolicy.SPREAD,
        validation_alias=AliasChoices("QSHARE_PLACEMENT_CARD", "QSHARE_CARD_POLICY"),
        description="claims' default card placement (QSHARE_PLACEMENT_CARD)",
    )

    @field_validator("node_policy", "card_policy", mode="before")
    @classmethod
    def _not_a_card_sharing_policy(cls, value: Any) -> Any:
        """QSHARE_NODE_POLICY is also the node agent's card sharing policy: a value of that
        kind in a shared environment is the agent's, not a placement; it leaves the default."""
        if isinstance(value, str) and value in {p.value for p in CardPolicy}:
            log.warning("placement policy %r is a card sharing policy (the node agent's "
                        "QSHARE_NODE_POLICY); placing with spread", value)  # fmt: skip
            return PlacementPolicy.SPREAD
        return value

    def max_vgpus(self, card_mib: int) -> int:
        """How many vGPUs one card of `card_mib` may hold (at least one)."""
        return max(1, card_mib // 1024 // self.gib_per_vgpu)
