"""Allocator settings (env prefix `QSHARE_ALLOCATOR_`), validated when built."""

from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.bus import BusIdentity, BusOptions
from qshare.dburl import DatabaseUrl
from qshare.health import HealthSettings
from qshare.metrics_http import MetricsSettings
from qshare.natsauth import ServiceRole
from qshare.settings import ClusterSettings


class AllocatorSettings(BaseSettings, BusIdentity, HealthSettings, MetricsSettings):
    model_config = SettingsConfigDict(env_prefix="QSHARE_ALLOCATOR_", extra="ignore")

    database_url: DatabaseUrl = Field(
        "postgresql+asyncpg://qshare:qshare@localhost:5432/qshare",
        description="Postgres, as psql takes it (postgres://, postgresql://, ?sslmode=, hosts)",
    )
    instance: str = Field(default_factory=socket.gethostname, description="CloudEvents source")
    max_in_flight: int = Field(16, ge=1, description="requests handled at once per replica")
    pool_size: int = Field(20, ge=2, description="at least max_in_flight + 2 (relay, sweeper)")
    create_group: int = Field(
        16, ge=1, description="claim creations sharing one transaction at most (1: none share)"
    )
    create_groups_open: int = Field(
        1, ge=1, description="shared claim-creation transactions open at once"
    )
    pending_sweep_s: float = Field(
        5.0, gt=0, description="retry pending claims at least this often"
    )
    outbox_scan_s: float = Field(1.0, gt=0, description="look for unpublished events this often")
    dispatch_scan_s: float = Field(
        1.0, gt=0, description="re-send desired state to unconfirmed nodes this often"
    )
    apply_timeout_s: float = Field(
        30.0, gt=0, description="a placed claim no node confirmed in this long fails"
    )
    register_again_s: float = Field(
        2.0, gt=0, description="ask a node whose heartbeat names no known node to register "
        "again (cmd.register) at most this often",
    )  # fmt: skip
    migrate_on_start: bool = Field(
        False,
        description="upgrade the schema before serving (else `python -m qshare_allocator migrate`)",
    )
    trace_console: bool = Field(False, description="also print every span on stderr")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)

    def bus(self, name: str) -> BusOptions:
        """How this service connects to NATS, as `name`."""
        return self.bus_as(name, ServiceRole.ALLOCATOR)
