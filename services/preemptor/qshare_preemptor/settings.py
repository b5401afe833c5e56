"""Preemptor settings (env prefix `QSHARE_PREEMPTOR_`), validated when built."""

from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.bus import BusIdentity
from qshare.dburl import DatabaseUrl
from qshare.health import HealthSettings
from qshare.metrics_http import MetricsSettings


class PreemptorSettings(BaseSettings, BusIdentity, HealthSettings, MetricsSettings):
    model_config = SettingsConfigDict(env_prefix="QSHARE_PREEMPTOR_", extra="ignore")

    database_url: DatabaseUrl = Field(
        "postgresql+asyncpg://qshare:qshare@localhost:5432/qshare",
        description="Postgres, as psql takes it (postgres://, postgresql://, ?sslmode=, hosts)",
    )
    instance: str = Field(default_factory=socket.gethostname, description="CloudEvents source")
    command_timeout_s: float = Field(2.0, gt=0, description="wait this long for a node's answer")
    pool_size: int = Field(5, ge=1, description="Postgres connections kept open")
    starvation_window_s: float = Field(
        60.0, gt=0, le=86400, description="the starvation watch judges this much usage at once"
    )
