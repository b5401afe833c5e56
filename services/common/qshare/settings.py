"""Settings shared by the control-plane services (env prefix `QSHARE_`), read when built."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.contracts.domain import PlacementPolicy


class ClusterSettings(BaseSettings):
    """Cluster-wide rules that the allocator enforces and the api reports.

    Granularity follows the qGPU seed: at least 1 GiB per vGPU, at most
    floor(card GiB / 4) vGPUs per card.
    """

    model_config = SettingsConfigDict(env_prefix="QSHARE_", extra="ignore")

    node_timeout_s: float = Field(30.0, gt=0, description="no heartbeat for this long: NotReady")
    min_vgpu_mib: int = Field(1024, ge=1, description="smallest vGPU memory")
    gib_per_vgpu: int = Field(4, ge=1, description="at most floor(card GiB / this) vGPUs per card")
    node_policy: PlacementPolicy = PlacementPolicy.SPREAD
    card_policy: PlacementPolicy = PlacementPolicy.SPREAD

    def max_vgpus(self, card_mib: int) -> int:
        """How many vGPUs one card of `card_mib` may hold (at least one)."""
        return max(1, card_mib // 1024 // self.gib_per_vgpu)
